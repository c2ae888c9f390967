"""One registry pattern for every pipeline phase whose strategies register by name.

The parameter exchange's collectives (``exchange=``, :mod:`zero_lab.collectives`) and the
gradient reduction's strategies (``grad_reduce=``, :mod:`zero_lab.grad_reduce`) are each a
:class:`Registry`: a name -> instance map seeded with the built-in classes, in registration
order (the exchange's ``"auto"`` prefers them in that order, :mod:`zero_lab.auto`); a class with
``auto_candidate = False`` is opt-in: registered, but never one of ``"auto"``'s candidates. A strategy is one class
checked against the phase's runtime ``Protocol`` when it registers; ``"auto"`` is reserved
(it chooses among the registered ones); a name is taken by one class only (registering the
same class again is a no-op); a registration lasts for the process. Errors name the key
(``exchange=`` / ``grad_reduce=``) and what to do::

    COLLECTIVES = Registry("exchange", Collective, (Broadcast, AllGather), "name, label, ... and nbytes()")
    COLLECTIVES.register(PaddedAllReduce)       # exchange="all_reduce" now works
    COLLECTIVES.named("ring")                   # ValueError: exchange='ring' is not one of ['auto', ...]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["Registry"]

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

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-in ones first, in registration order."""
        return tuple(self._entries)

    def auto_names(self) -> tuple[str, ...]:
        """The names ``"auto"`` chooses among: every registered one but those whose class says
        ``auto_candidate = False`` (opt-in strategies, e.g. the host-local shared-memory ones)."""
        return tuple(name for name, s in self._entries.items() if getattr(s, "auto_candidate", True))

    def named(self, name: str) -> T:
        """The strategy registered as ``name``; a clear error listing the others if none is."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"{self.key}={name!r} is not one of {['auto', *self._entries]}") from None
