"""The collectives a parameter exchange can use: one class each, registered by name.

Every unit the exchange moves (:mod:`zero_lab.exchange`: a buffer, or one shard) is a
1-D tensor ``storage`` cut into per-rank ranges ``bounds`` — ``bounds[r] = (start, stop)``
is rank r's, in rank order, possibly empty. On entry each rank's own range is up to date;
a :class:`Collective` makes the whole of ``storage`` up to date on every rank:

* :class:`Broadcast` (``"broadcast"``) — one broadcast per non-empty range, from its
  owner, in place;
* :class:`AllGather` (``"all_gather"``) — one ``all_gather_into_tensor``: straight into
  ``storage`` when the ranges are equal and rank-major (``bounds[r] == (r·n, (r+1)·n)``); otherwise each
  rank's range is zero-padded to the longest in a ``W × longest`` staging buffer, which
  is gathered and the other ranks' ranges copied out of when it lands;
* :class:`P2PAllGather` (``"p2p_all_gather"``) — point to point, in place: each rank
  sends its range to every peer (``isend``) and receives every peer's range straight into
  ``storage`` (``irecv``; no staging, no padding; on Gloo, one host, 38 MiB at W=2: 16.5 ms against
  19.8 ms for one broadcast per rank and 77 ms for ``all_gather_into_tensor``, FIELD-NOTES);
* :class:`ShmAllGather` (``"shm_all_gather"``) — the same through host-local shared memory
  (:mod:`zero_lab.host_shm`): ranks of one host only, never ``"auto"``'s candidate (the engine's
  default on one x86-64 host).

Each collective goes through :class:`~zero_lab.comm.Communicator`, so it is labelled
``zero_lab::<label>`` in the profiler, and its bytes, calls and seconds are metered. The
registry (a :class:`zero_lab.registry.Registry`, the pattern every phase's strategies share)
maps ``exchange=`` names to collectives; :data:`COLLECTIVES` (the built-in
names, in registration order: ``exchange="auto"``'s preference among the ones that fill a unit
in place, :func:`zero_lab.exchange.auto_collectives`) and :data:`EXCHANGES` (``"auto"``
first) are derived from it. A new collective is one class plus its tests::

    @register_collective
    class PaddedAllReduce:
        name = "all_reduce"
        label = "exchange_all_reduce"
        in_place_shards = False

        def issue(self, comm, storage, bounds, op):
            start, stop = bounds[comm.rank]
            storage[:start].zero_()  # every rank zeroes all but its own range ...
            storage[stop:].zero_()
            return InFlight(comm.issue_all_reduce(storage, op=op))  # ... and one sum fills it

        def nbytes(self, bounds, itemsize):
            return bounds[-1][1] * itemsize

    ZeroRedundancyOptimizer(params, torch.optim.Adam, exchange="all_reduce")  # by name (auto: in-place ones only)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import torch

from zero_lab import host_shm
from zero_lab.comm import Communicator, Pending
from zero_lab.registry import Registry

__all__ = [
    "COLLECTIVES",
    "EXCHANGES",
    "AllGather",
    "Broadcast",
    "Collective",
    "InFlight",
    "P2PAllGather",
    "ShmAllGather",
    "candidate_collectives",
    "collective_named",
    "register_collective",
    "registered_collectives",
]

Bounds = Sequence[tuple[int, int]]
C = TypeVar("C", bound=type)


class InFlight:
    """One unit's collectives in flight and what to do when they land (copy out of staging)."""

    def __init__(self, pending: Pending, finish: Callable[[], None] | None = None):
        self.pending = pending
        self._finish = finish
        self.done = False
        self.param_indices: frozenset[int] = frozenset()  # global indices of the parameters it writes

    def then(self, finish: Callable[[], None] | None) -> InFlight:
        """The same collectives, followed by ``finish`` after this one's own finishing step."""
        if finish is None:
            return self
        before = self._finish

        def both() -> None:
            if before is not None:
                before()
            finish()

        return InFlight(self.pending, both)

    def wait(self) -> None:
        if self.done:
            return
        self.pending.wait()
        if self._finish is not None:
            self._finish()
        self.done = True


@runtime_checkable
class Collective(Protocol):
    """Fills a buffer of per-rank ranges on every rank (see the module docstring).

    ``name``: the value of ``exchange=``. ``label``: the Communicator op, so the profiler
    shows ``zero_lab::<label>`` (and ``zero_lab::<label>/wait``). ``in_place_shards``:
    how the ``per_shard`` layout (a whole-parameter partition without bucket views) is
    cut into units — ``True``: every shard is its own unit, filled in place (its
    ``bounds`` are empty but for the owner's; a collective that sends each range from its
    owner, like a broadcast); ``False``: the shards are staged in one rank-major buffer
    per (device, dtype), one unit each. Only collectives with ``in_place_shards`` (they fill
    any unit in place, staging nothing) are ``exchange="auto"``'s candidates, and not those whose
    class says ``auto_candidate = False`` (opt-in, as :class:`ShmAllGather`).
    """

    name: str
    label: str
    in_place_shards: bool

    def issue(self, comm: Communicator, storage: torch.Tensor, bounds: Bounds, op: str) -> InFlight:
        """Start filling ``storage`` from every rank's range; ``wait()`` the result.
        Every rank calls it with the same ``bounds``; ``op`` is the Communicator label."""
        ...

    def nbytes(self, bounds: Bounds, itemsize: int) -> int:
        """The payload bytes each rank's Communicator counts for one :meth:`issue`."""
        ...


class Broadcast:
    """One broadcast per non-empty range, from the rank that owns it, in place."""

    name = "broadcast"
    label = "exchange_broadcast"
    in_place_shards = True

    def issue(self, comm: Communicator, storage: torch.Tensor, bounds: Bounds, op: str) -> InFlight:
        ranges = [(storage[a:b], rank) for rank, (a, b) in enumerate(bounds) if b > a]
        return InFlight(comm.issue_broadcasts(ranges, op=op))

    def nbytes(self, bounds: Bounds, itemsize: int) -> int:
        return sum(b - a for a, b in bounds) * itemsize


class AllGather:
    """One ``all_gather_into_tensor``; unequal ranges are padded to the longest in staging."""

    name = "all_gather"
    label = "exchange_all_gather"
    in_place_shards = False

    def issue(self, comm: Communicator, storage: torch.Tensor, bounds: Bounds, op: str) -> InFlight:
        start, stop = bounds[comm.rank]
        chunk = max(b - a for a, b in bounds)
        if all((a, b) == (r * chunk, (r + 1) * chunk) for r, (a, b) in enumerate(bounds)):
            return InFlight(comm.issue_all_gather(storage, storage[start:stop].clone(), op=op))
        local = torch.zeros(chunk, dtype=storage.dtype, device=storage.device)
        local[: stop - start].copy_(storage[start:stop])
        gathered = torch.empty(chunk * len(bounds), dtype=storage.dtype, device=storage.device)

        def unpad() -> None:
            for rank, (a, b) in enumerate(bounds):
                if rank != comm.rank:
                    storage[a:b].copy_(gathered[rank * chunk : rank * chunk + b - a])

        return InFlight(comm.issue_all_gather(gathered, local, op=op), unpad)

    def nbytes(self, bounds: Bounds, itemsize: int) -> int:
        return max(b - a for a, b in bounds) * len(bounds) * itemsize


class P2PAllGather:
    """Point-to-point all-gather in place: every rank sends its range to each peer and
    receives each peer's range straight into ``storage`` (unequal ranges need no padding)."""

    name = "p2p_all_gather"
    label = "exchange_p2p_all_gather"
    in_place_shards = True

    def issue(self, comm: Communicator, storage: torch.Tensor, bounds: Bounds, op: str) -> InFlight:
        return InFlight(comm.issue_all_gather_p2p(storage, bounds, op=op))

    def nbytes(self, bounds: Bounds, itemsize: int) -> int:
        return sum(b - a for a, b in bounds) * itemsize


class ShmAllGather:
    """The point-to-point all-gather through host-local shared memory (:mod:`zero_lab.host_shm`), in
    place: each rank writes its range into its mailbox once, each copies the peers' ranges into place.
    Ranks of one x86-64 host, CPU tensors; never ``exchange="auto"``'s (the engine's default there);
    metered as :class:`P2PAllGather`."""

    name = "shm_all_gather"
    label = "exchange_shm_all_gather"
    in_place_shards = True
    auto_candidate = False
    host_shm = True

    def issue(self, comm: Communicator, storage: torch.Tensor, bounds: Bounds, op: str) -> InFlight:
        return InFlight(host_shm.all_gather(comm, storage, bounds, op=op))

    nbytes = P2PAllGather.nbytes  # the same messages, through the mailboxes


#: ``exchange=`` name -> collective, in registration order (``auto``'s preference among the in-place ones).
_REGISTRY: Registry[Collective] = Registry(
    "exchange",
    Collective,
    (Broadcast, AllGather, P2PAllGather, ShmAllGather),
    "name, label, in_place_shards, issue() and nbytes()",
)


def register_collective(cls: C) -> C:
    """Make ``cls()`` the collective of ``exchange=cls.name`` (and a candidate of ``"auto"``);
    returns ``cls``, so it works as a decorator. Registering the same class again is a no-op."""
    return _REGISTRY.register(cls)


def registered_collectives() -> tuple[str, ...]:
    """Every registered collective's name, built-in ones first."""
    return _REGISTRY.names()


def candidate_collectives() -> tuple[str, ...]:
    """The registered collectives ``"auto"`` may choose (all but the opt-in ones, ``auto_candidate = False``)."""
    return _REGISTRY.auto_names()


def collective_named(name: str) -> Collective:
    """The collective registered as ``name``; a clear error listing the others if none is."""
    return _REGISTRY.named(name)


#: The built-in collectives ``exchange="auto"`` may choose, in the order it tries them (ties go to the first).
COLLECTIVES: tuple[str, ...] = candidate_collectives()
#: Accepted values of ``exchange=`` without registering more (the opt-in ``shm_all_gather`` included).
EXCHANGES: tuple[str, ...] = ("auto", *registered_collectives())
