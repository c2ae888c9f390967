"""One registry pattern for every pipeline phase whose strategies register by name.

The parameter exchange's collectives (``exchange=``, :mod:`zero_lab.collectives`) and the
gradient reduction's strategies (``grad_reduce=``, :mod:`zero_lab.grad_reduce`) are each a
:class:`Registry`: a name -> instance map seeded with the built-in classes, in the order
``"auto"`` tries them. A strategy is one class checked against the phase's runtime
``Protocol`` when it registers; ``"auto"`` is reserved (it chooses among the registered
ones); a name is taken by one class only (registering the same class again is a no-op);
built-in entries cannot be removed. Errors name the key (``exchange=`` / ``grad_reduce=``)
and what to do. ``"auto"`` decides with :func:`choose`: the first candidate, in registration
order, whose measured time is within :data:`AUTO_MARGIN` of the fastest — so candidates
that measure alike (where load, not the collective, makes the difference) always resolve
the same way, and the choice is never slower than the fastest measured by more than the
margin. A world measures each decision once: :func:`remember` keeps it under a key naming
everything it depends on (phase, the group's ranks and backend, dtype, device, candidates,
sizes), and a later ``"auto"`` with the same key takes it from :func:`decided` without a
trial — on a shared machine two candidates that measure alike swapped places from one
trial to the next (up to 1.97× apart under load), so re-measuring would make the same
config choose differently in the same world::

    COLLECTIVES = Registry("exchange", Collective, (Broadcast, AllGather), "name, label, ... and nbytes()")
    COLLECTIVES.register(PaddedAllReduce)       # exchange="all_reduce" now works, and "auto" times it
    COLLECTIVES.named("ring")                   # ValueError: exchange='ring' is not one of ['auto', ...]
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["AUTO_MARGIN", "Registry", "choose", "decided", "forget_decisions", "remember"]

#: ``"auto"`` takes the first registered candidate within this fraction of the fastest measured one.
AUTO_MARGIN = 0.10

T = TypeVar("T")
C = TypeVar("C", bound=type)


class Registry(Generic[T]):
    """Strategies of one phase by name (see the module docstring).

    ``key``: the option the names are values of (used in every error message).
    ``protocol``: a ``runtime_checkable`` Protocol each instance must satisfy; ``needs``
    says in words what it requires. ``builtins``: the classes registered at import.
    """

    def __init__(self, key: str, protocol: type, builtins: Iterable[type], needs: str):
        self.key = key
        self.protocol = protocol
        self.needs = needs
        self._entries: dict[str, T] = {}
        for cls in builtins:
            self.register(cls)
        self.builtins: tuple[str, ...] = tuple(self._entries)

    def register(self, cls: C) -> C:
        """Make ``cls()`` the strategy of ``<key>=cls.name`` (and a candidate of ``"auto"``);
        returns ``cls``, so it works as a decorator."""
        strategy = cls()
        if not isinstance(strategy, self.protocol):
            raise TypeError(f"{cls.__name__} is not a {self.protocol.__name__}: it needs {self.needs}")
        name = strategy.name  # type: ignore[attr-defined]
        if name == "auto":
            raise ValueError(f"{cls.__name__}.name='auto' is taken: {self.key}='auto' chooses among the strategies")
        known = self._entries.get(name)
        if known is not None and type(known) is not cls:
            raise ValueError(f"{self.key}={name!r} is already {type(known).__name__}; give {cls.__name__} another name")
        self._entries[name] = strategy  # type: ignore[assignment]
        return cls

    def unregister(self, name: str) -> None:
        """Forget a registered strategy (tests that register deliberately slow ones)."""
        if name in self.builtins:
            raise ValueError(f"{self.key}={name!r} is built in and cannot be unregistered")
        self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-in ones first (the order ``"auto"`` tries them)."""
        return tuple(self._entries)

    def named(self, name: str) -> T:
        """The strategy registered as ``name``; a clear error listing the others if none is."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"{self.key}={name!r} is not one of {['auto', *self._entries]}") from None

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries (tests swap one in and out)."""
        twin: Registry[T] = Registry.__new__(Registry)
        twin.key, twin.protocol, twin.needs, twin.builtins = self.key, self.protocol, self.needs, self.builtins
        twin._entries = dict(self._entries)
        return twin


def choose(timings: dict[str, float], margin: float = AUTO_MARGIN) -> str:
    """``"auto"``'s rule: the first name of ``timings`` (in the order given: registration order)
    whose time is at most ``(1 + margin)`` × the fastest. A stable choice, not a race: two
    candidates whose times differ by less than ``margin`` resolve to the earlier one, whichever
    happened to measure faster this time."""
    if not timings:
        raise ValueError("auto: no candidate to choose from (register one)")
    fastest = min(timings.values())
    return next(name for name, seconds in timings.items() if seconds <= fastest * (1 + margin))


# (phase, group ranks, backend, dtype, device, candidates, sizes) -> (choice, timings, sample bytes)
_DECISIONS: dict[tuple[Hashable, ...], tuple[str, dict[str, float], int]] = {}


def decided(key: tuple[Hashable, ...]) -> tuple[str, dict[str, float], int] | None:
    """An earlier ``"auto"`` decision of this process under ``key`` (choice, timings, sample bytes)."""
    found = _DECISIONS.get(key)
    return None if found is None else (found[0], dict(found[1]), found[2])


def remember(key: tuple[Hashable, ...], choice: str, timings: dict[str, float], sample_bytes: Any) -> None:
    """Keep an ``"auto"`` decision for later ones with the same ``key`` (every rank keeps the same:
    the figures are agreed by an all-reduce, and every rank of a group decides the same keys in
    the same order)."""
    _DECISIONS[key] = (choice, dict(timings), int(sample_bytes))


def forget_decisions() -> None:
    """Drop every remembered decision: the next ``"auto"`` measures again (e.g. after the load changed)."""
    _DECISIONS.clear()
