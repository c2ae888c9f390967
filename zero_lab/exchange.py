"""Every way parameters (and the joined ranks' gradients) move between ranks.

After each rank steps its shards, :class:`ParamExchange` makes every replica whole
again. Two choices make up its ``mode``:

**Layout** (from the partition and ``parameters_as_bucket_view``):

* ``flat`` — the partition has buffer layouts (element-granular, :class:`~zero_lab.partition.Flat`):
  one buffer per layout, rank r owning the equal range ``bounds[r]``. With bucket
  views the parameters *are* views into the buffer; without, each rank stages its
  range into a temporary buffer and copies the other ranks' ranges out.
* ``bucket`` — bucket views over a whole-parameter partition: each (device, dtype)
  gets one buffer laid out rank by rank (trainable parameters only), parameters are
  views into it, rank r owns its (unequal) segment.
* ``per_shard`` — otherwise: ``param.data`` is never replaced; the shards are
  exchanged in place, one unit each (a collective with ``in_place_shards``: broadcast),
  or through a rank-major staging buffer (all-gather).

**Collective** (``exchange=``), a :class:`~zero_lab.collectives.Collective` registered
by name in :mod:`zero_lab.collectives`, fills each unit from every rank's range:
``broadcast`` — one broadcast per rank of its range of each buffer (per shard in the
``per_shard`` layout, its ``in_place_shards``); ``all_gather`` — one
``all_gather_into_tensor`` per buffer (unequal segments are padded to the longest in
a staging buffer); ``auto`` — at the first exchange, the candidates are timed on the
exchange itself (:mod:`zero_lab.auto`, one tuner for every phase): each trial of a candidate is
the real exchange of the real units, in place — every rank's own ranges are up to date, so
running it again leaves every replica whole, and the trial stages no copy the exchange would not
make anyway. The candidates are the registered collectives that fill a unit in place
(``in_place_shards``: ``broadcast``, ``p2p_all_gather``, in registration order, which is the
preference order for near-ties): a collective that stages a padded or rank-major copy
(``all_gather``) costs memory in every step, and ``auto`` never trades memory for time
(``exchange="all_gather"`` still runs it). The slowest rank's medians decide, so every rank
picks the same; a candidate displaces the preferred one only when it is clearly faster (beyond
the trial's own noise, at least 10 %); :meth:`ParamExchange.report` carries the medians, their
noise and the candidates that were within it. On one host with Gloo broadcasts win by 4-6x
over ``all_gather_into_tensor``; on NCCL all-gather usually does (name it).

Every rank issues the same collectives in the same order, because all of it is
derived from the partition, which every rank computes identically. At world size 1
nothing is issued (the local step already updated every parameter).

Asynchronous use (``zero_lab.overlap.prefetch_exchange``): :meth:`ParamExchange.start`
issues everything and returns; :meth:`ParamExchange.wait` finishes the units holding
given parameters (or all). Given a :class:`FirstUse`, ``start`` issues the units in the
order the forward first reads their parameters (rank 0's order, adopted by every rank),
so the first layer's buffer lands first. The Join gradient broadcast (:func:`share_grads_with_joined`)
and the overlap hooks' per-bucket sends (:func:`issue_owner_broadcast`) live here too,
all through :class:`~zero_lab.comm.Communicator`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from zero_lab.auto import Decision, tune
from zero_lab.bucket_views import standalone_view
from zero_lab.collectives import (
    COLLECTIVES,
    EXCHANGES,
    Collective,
    InFlight,
    candidate_collectives,
    collective_named,
    registered_collectives,
)
from zero_lab.comm import CommStats, Communicator
from zero_lab.partition import Partition

__all__ = [
    "COLLECTIVES",
    "EXCHANGES",
    "ExchangeReport",
    "FirstUse",
    "InFlight",
    "ParamExchange",
    "issue_owner_broadcast",
    "share_grads_with_joined",
]


def auto_collectives() -> tuple[str, ...]:
    """The collectives ``exchange="auto"`` chooses among, in its preference order: the registered
    ones that fill a unit in place (``in_place_shards``) and are not opt-in (``auto_candidate = False``),
    registration order."""
    return tuple(name for name in candidate_collectives() if collective_named(name).in_place_shards)


@dataclass(frozen=True)
class ExchangeReport:
    """What the exchange does and, with ``auto``, how it chose (seconds, max over ranks)."""

    mode: str  # "<layout>_<collective>", e.g. "flat_broadcast"
    layout: str  # "flat", "bucket" or "per_shard"
    collective: str  # a registered collective's name, "auto" (not decided yet) or "none" (world size 1)
    requested: str  # the constructor's exchange=
    timings_s: dict[str, float] = field(default_factory=dict)  # auto: median exchange time per candidate
    sample_bytes: int = 0  # auto: the bytes one trial moved (the whole exchange)
    noise_s: dict[str, float] = field(default_factory=dict)  # auto: half the spread of each candidate's times
    within_noise: tuple[str, ...] = ()  # auto: the candidates indistinguishable from the choice

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "layout": self.layout,
            "collective": self.collective,
            "requested": self.requested,
            "timings_s": dict(self.timings_s),
            "tune_sample_bytes": self.sample_bytes,
            "noise_s": dict(self.noise_s),
            "within_noise": list(self.within_noise),
        }


class FirstUse:
    """Parameters in the order a forward first reads them; one agreed order for all ranks.

    ``prefetch_exchange``'s pre-hooks :meth:`note` each module's parameters as the forward
    reaches them. At the next exchange :meth:`agree` broadcasts rank 0's positions (one
    int64 per parameter, once), so every rank issues the units in the same order even if
    their forwards differed; if rank 0 has seen no forward yet, every rank tries again at
    the next exchange. :meth:`ordered` sorts units by their earliest-used parameter
    (units never used keep their place, after the used ones).
    """

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}
        self.position: dict[int, int] | None = None  # agreed: parameter index -> first-use rank

    def note(self, params: Iterable[int]) -> None:
        if self.position is None:
            for index in params:
                self._seen.setdefault(index, len(self._seen))

    def agree(self, comm: Communicator, num_params: int, device: torch.device) -> None:
        """Adopt rank 0's order (collective: every rank calls it at the same exchange)."""
        if self.position is not None:
            return
        order = torch.full((num_params,), -1, dtype=torch.int64, device=device)
        for index, position in self._seen.items():
            if index < num_params:
                order[index] = position
        comm.broadcast_many([(order, 0)], op="exchange_order")
        agreed = {index: position for index, position in enumerate(order.tolist()) if position >= 0}
        if agreed:
            self.position = agreed

    def ordered(self, units: Sequence[_Unit]) -> Sequence[_Unit]:
        position = self.position
        if not position:
            return units
        never = len(position)
        return sorted(units, key=lambda unit: min((position.get(i, never) for i in unit.param_indices), default=never))


@dataclass(frozen=True)
class _Piece:
    """Elements ``[start, stop)`` of flattened parameter ``param`` at buffer ``[offset, offset + stop - start)``."""

    param: int
    start: int
    stop: int
    offset: int


def _rank_major(partition: Partition, trainable: Sequence[bool]) -> list[tuple[list[_Piece], list[tuple[int, int]]]]:
    """Per kind: the trainable shards laid out rank 0's first, then rank 1's, ...; and each rank's bounds."""
    per_kind: dict[str, list[list[tuple[int, int, int]]]] = {}
    for shard in sorted(partition.shards, key=lambda s: (s.rank, s.param, s.start)):
        if trainable[shard.param]:
            kind = partition.specs[shard.param].kind
            ranks = per_kind.setdefault(kind, [[] for _ in range(partition.world_size)])
            ranks[shard.rank].append((shard.param, shard.start, shard.stop))
    out = []
    for per_rank in per_kind.values():
        pieces, bounds, total = [], [], 0
        for shards in per_rank:
            first = total
            for param, start, stop in shards:
                pieces.append(_Piece(param, start, stop, total))
                total += stop - start
            bounds.append((first, total))
        out.append((pieces, bounds))
    return out


class _Buffer:
    """Pieces of parameters in one contiguous buffer, rank r owning ``bounds[r]``.

    With ``as_view`` the buffer is allocated once and the (whole) parameters become
    views into it; otherwise each exchange stages this rank's range into a fresh buffer
    and copies the other ranks' ranges back into the parameters when it lands.
    """

    def __init__(self, pieces: list[_Piece], bounds: Sequence[tuple[int, int]], numel: int, params, as_view: bool):
        self.pieces = pieces
        self.bounds = list(bounds)
        self.numel = numel
        self.params: list[torch.Tensor] = params
        self.param_indices = frozenset(p.param for p in pieces)
        first = params[pieces[0].param]
        self.dtype, self.device = first.dtype, first.device
        self.storage: torch.Tensor | None = None
        if as_view:
            self.storage = torch.zeros(numel, dtype=self.dtype, device=self.device)
            for piece in pieces:
                param = params[piece.param]
                self.storage[piece.offset : piece.offset + param.numel()].copy_(param.data.reshape(-1))
                param.data = standalone_view(self.storage, piece.offset, param.data)  # serializes (safetensors)

    def _copy(self, storage: torch.Tensor, ranks: Iterable[int], into_params: bool) -> None:
        """Copy each piece's part inside ``bounds[r]`` (r in ``ranks``) between params and ``storage``."""
        for rank in ranks:
            lo_r, hi_r = self.bounds[rank]
            for piece in self.pieces:
                lo, hi = max(lo_r, piece.offset), min(hi_r, piece.offset + piece.stop - piece.start)
                if hi <= lo:
                    continue
                param = self.params[piece.param]
                if into_params and not param.requires_grad:
                    continue
                a, b = piece.start + lo - piece.offset, piece.start + hi - piece.offset
                if into_params:
                    _write_elements(param.data, a, b, storage[lo:hi])
                else:
                    storage[lo:hi].copy_(param.data.reshape(-1)[a:b])

    def issue(self, comm: Communicator, collective: Collective, staging: torch.Tensor | None = None) -> InFlight:
        """Fill the buffer with ``collective``; without a view, stage this rank's range first (in
        ``staging`` when given, else a fresh buffer) and copy the other ranks' ranges into the
        parameters when it lands."""
        if self.storage is not None:
            return collective.issue(comm, self.storage, self.bounds, collective.label)
        storage = staging if staging is not None else torch.empty(self.numel, dtype=self.dtype, device=self.device)
        self._copy(storage, [comm.rank], into_params=False)
        others = [r for r in range(comm.world_size) if r != comm.rank]
        inflight = collective.issue(comm, storage, self.bounds, collective.label)
        return inflight.then(lambda: self._copy(storage, others, into_params=True))


class _Shard:
    """One shard filled in place from its owner (``per_shard`` layout, a collective with ``in_place_shards``)."""

    def __init__(self, params: list[torch.Tensor], param: int, start: int, stop: int, owner: int, world_size: int):
        self.params = params
        self.param_indices = frozenset((param,))
        self.index, self.start, self.stop = param, start, stop
        # the shard is the whole of its unit: empty ranges before and after the owner's
        numel = stop - start
        self.bounds = [(0, 0)] * owner + [(0, numel)] + [(numel, numel)] * (world_size - owner - 1)

    def issue(self, comm: Communicator, collective: Collective) -> InFlight:
        param = self.params[self.index].data
        if param.is_contiguous():
            return collective.issue(comm, param.view(-1)[self.start : self.stop], self.bounds, collective.label)
        staged = param.reshape(-1)[self.start : self.stop].clone()  # fill a copy; write it back when it lands
        inflight = collective.issue(comm, staged, self.bounds, collective.label)
        return inflight.then(lambda: _write_elements(param, self.start, self.stop, staged))


_Unit = _Buffer | _Shard


class ParamExchange:
    """Synchronises parameter shards across ranks; see the module docstring.

    ``run()`` exchanges and returns when done; ``start()`` + ``wait()`` do it
    asynchronously. ``rebuild()`` after trainability changed, ``update()`` after a
    param group was added.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        partition: Partition,
        comm: Communicator,
        bucket_view: bool,
        exchange: str = "auto",
    ):
        if exchange != "auto":
            collective_named(exchange)  # a clear error naming the registered ones
        if bucket_view and not partition.is_whole and not partition.layouts:
            raise ValueError(
                "parameters_as_bucket_view=True needs a whole-parameter partition or one with buffer layouts "
                "(Flat); this partitioner cuts parameters without layouts: use parameters_as_bucket_view=False"
            )
        self.params = list(params)
        self.partition = partition
        self.comm = comm
        self.bucket_view = bucket_view
        self.requested = exchange
        self.collective = exchange if comm.world_size > 1 else "none"
        self.decision: Decision | None = None  # auto, once decided
        self.buffers: list[_Buffer] = []
        self._shard_units: list[_Shard] = []
        self._inflight: list[tuple[frozenset[int], InFlight]] = []
        self._first_use_order: tuple[str, Sequence[_Unit]] | None = None  # (collective, units)
        self.rebuild()

    # ------------------------------------------------------------------ layout
    @property
    def layout(self) -> str:
        if self.partition.layouts:
            return "flat"
        return "bucket" if self.bucket_view else "per_shard"

    @property
    def mode(self) -> str:
        return f"{self.layout}_{self.collective}"

    def report(self) -> ExchangeReport:
        decided = self.decision or Decision(self.collective)
        return ExchangeReport(
            self.mode,
            self.layout,
            self.collective,
            self.requested,
            dict(decided.timings_s),
            decided.sample_bytes,
            dict(decided.noise_s),
            decided.within_noise,
        )

    def rebuild(self) -> None:
        """(Re)build buffers, e.g. after parameters changed trainability."""
        self.wait()
        self._first_use_order = None
        trainable = [p.requires_grad for p in self.params]
        if self.layout == "flat":
            if not self.buffers:
                self.buffers = [self._flat_buffer(layout) for layout in self.partition.layouts]
            return
        if self.layout == "bucket" and self.buffers:
            for param, is_trainable in zip(self.params, trainable):
                if not is_trainable:
                    # Detach frozen parameters from the old buffer so its reuse cannot clobber them.
                    param.data = param.data.detach().clone()
        as_view = self.layout == "bucket"
        self.buffers = [
            _Buffer(pieces, bounds, bounds[-1][1], self.params, as_view)
            for pieces, bounds in _rank_major(self.partition, trainable)
            if pieces
        ]
        self._shard_units = [
            _Shard(self.params, s.param, s.start, s.stop, s.rank, self.partition.world_size)
            for s in sorted(self.partition.shards, key=lambda s: (s.param, s.start))
            if trainable[s.param]
        ]

    def _flat_buffer(self, layout) -> _Buffer:
        pieces = [
            _Piece(index, 0, self.partition.specs[index].numel, offset)
            for index, offset in zip(layout.params, layout.offsets)
        ]
        return _Buffer(pieces, layout.bounds, layout.numel, self.params, self.bucket_view)

    def update(self, params: Sequence[torch.Tensor], partition: Partition) -> None:
        """Adopt a partition extended by an added group; existing flat buffers are kept
        (the local optimizer's slice views point into them)."""
        self.wait()
        self._first_use_order = None
        self.params[:] = list(params)  # the buffers hold this list
        self.partition = partition
        if self.layout == "flat":
            built = len(self.buffers)
            self.buffers += [self._flat_buffer(layout) for layout in partition.layouts[built:]]
        else:
            self.rebuild()

    @property
    def unit_count(self) -> int:
        names = registered_collectives()
        candidates = auto_collectives() if self.collective not in names else (self.collective,)
        return max(len(self._units(c)) for c in candidates)

    def _units(self, collective: str) -> Sequence[_Unit]:
        """The units ``collective`` fills: single shards or buffers (see ``Collective.in_place_shards``)."""
        if self.layout == "per_shard" and collective_named(collective).in_place_shards:
            return self._shard_units
        return self.buffers

    # ------------------------------------------------------------------ exchange
    def run(self) -> None:
        """Exchange every rank's updated shards; returns when every replica is whole."""
        self.start()
        self.wait()

    def start(self, first_use: FirstUse | None = None) -> None:
        """Issue the exchange (in ``first_use`` order when given); :meth:`wait` finishes it.
        With ``auto`` the first call also chooses the collective, which finishes the
        exchange before returning."""
        self.wait()
        if self.comm.world_size == 1:
            return
        if first_use is not None:
            first_use.agree(self.comm, len(self.params), self.params[0].device)
        if self.collective == "auto" and self._tune():
            return  # the trials ran this exchange, on the real units: every replica is whole now
        collective = collective_named(self.collective)
        for unit in self._issue_order(first_use):
            self._inflight.append((unit.param_indices, unit.issue(self.comm, collective)))

    def _issue_order(self, first_use: FirstUse | None) -> Sequence[_Unit]:
        """The units of this collective in first-use order once agreed (sorted once per build), else build order."""
        units = self._units(self.collective)
        if first_use is None or not first_use.position:
            return units
        if self._first_use_order is None or self._first_use_order[0] != self.collective:
            self._first_use_order = (self.collective, first_use.ordered(units))
        return self._first_use_order[1]

    def track(self, params: frozenset[int], inflight: InFlight) -> None:
        """Count collectives issued elsewhere (the overlap hooks' sends) as this exchange's in-flight work."""
        self._inflight.append((params, inflight))

    @property
    def in_flight(self) -> bool:
        return bool(self._inflight)

    def wait(self, params: Iterable[int] | None = None) -> None:
        """Finish the in-flight units holding any of the global parameter indices ``params`` (all if ``None``)."""
        if not self._inflight:
            return
        wanted = None if params is None else set(params)
        keep = []
        for indices, inflight in self._inflight:
            if wanted is None or not indices.isdisjoint(wanted):
                inflight.wait()
            else:
                keep.append((indices, inflight))
        self._inflight = keep

    def _tune(self) -> bool:
        """Time every in-place collective on the exchange itself and take the tuner's choice
        (see the module docstring); ``True`` when trials ran (the exchange is then done), ``False``
        when this world had decided the same exchange before (no trial: it still has to run)."""
        trainable = [s for s in self.partition.shards if self.params[s.param].requires_grad]
        first = self.params[trainable[0].param] if trainable else self.params[0]
        candidates = auto_collectives()
        units = {
            name: tuple(_unit_numel(unit) * first.element_size() for unit in self._units(name)) for name in candidates
        }
        key = (
            "exchange",
            tuple(self.comm.global_rank(r) for r in range(self.comm.world_size)),
            dist.get_backend(self.comm.group),
            str(first.dtype),
            first.device.type,
            self.layout,
            tuple(units.items()),
        )

        staged: dict[int, torch.Tensor] = {}  # layouts that stage (no views): one buffer per unit, all trials
        one_run: dict[str, CommStats] = {}  # what one exchange with each candidate meters

        def trial(name: str) -> None:
            started = self.comm.stats.snapshot()
            collective = collective_named(name)
            issued = []
            for unit in self._units(name):
                if isinstance(unit, _Buffer) and unit.storage is None:
                    staging = staged.setdefault(id(unit), torch.empty(unit.numel, dtype=unit.dtype, device=unit.device))
                    issued.append(unit.issue(self.comm, collective, staging))
                else:
                    issued.append(unit.issue(self.comm, collective))
            for inflight in issued:
                inflight.wait()
            one_run[name] = self.comm.stats.since(started)

        before = self.comm.stats.snapshot()
        self.decision = tune(
            key,
            self.comm,
            candidates,
            trial,
            device=first.device,
            sample_bytes=max(sum(sizes) for sizes in units.values()),
            label="exchange_tune",
        )
        staged.clear()
        self.collective = self.decision.choice
        if not one_run:
            return False
        # the training's traffic is one exchange with the choice, not the trial's repetitions
        self.comm.stats.reset_to(before.plus(one_run[self.collective]))
        return True


def _unit_numel(unit: _Unit) -> int:
    return unit.numel if isinstance(unit, _Buffer) else unit.stop - unit.start


# ---------------------------------------------------------------------- overlap hooks' sends
def issue_owner_broadcast(
    comm: Communicator, owner: int, pieces: Sequence[tuple[torch.Tensor, int, int]], op: str = "overlap_broadcast"
) -> InFlight:
    """Start broadcasting ``owner``'s element ranges ``(param, start, stop)`` packed in one buffer;
    on the other ranks the wait copies them into the parameters."""
    first = pieces[0][0]
    buffer = torch.empty(sum(b - a for _, a, b in pieces), dtype=first.dtype, device=first.device)
    if owner == comm.rank:
        _pack(buffer, pieces, into_params=False)
    pending = comm.issue_broadcasts([(buffer, owner)], op=op)
    finish = None if owner == comm.rank else (lambda: _pack(buffer, pieces, into_params=True))
    return InFlight(pending, finish)


def _pack(buffer: torch.Tensor, pieces: Sequence[tuple[torch.Tensor, int, int]], into_params: bool) -> None:
    offset = 0
    for param, a, b in pieces:
        if into_params:
            _write_elements(param.data, a, b, buffer[offset : offset + b - a])
        else:
            buffer[offset : offset + b - a].copy_(param.data.reshape(-1)[a:b])
        offset += b - a


def _write_elements(tensor: torch.Tensor, start: int, stop: int, values: torch.Tensor) -> None:
    """``tensor.view(-1)[start:stop] = values``, also for a non-contiguous tensor (whose reshape is a copy)."""
    if tensor.is_contiguous():
        tensor.view(-1)[start:stop].copy_(values)
        return
    flat = tensor.reshape(-1)
    flat[start:stop].copy_(values)
    tensor.copy_(flat.view_as(tensor))


# ---------------------------------------------------------------------- Join
def share_grads_with_joined(
    comm: Communicator, params: Sequence[torch.Tensor], partition: Partition, active: bool
) -> None:
    """Active ranks send each joined rank the gradients of its shards (uneven inputs, Join).

    One all-reduce of an "active" flag per rank tells everyone who joined; then the
    lowest active rank broadcasts each joined rank's trainable shard gradients, packed
    in one buffer, and the joined rank writes them into its ``param.grad``.
    """
    device = params[0].device
    flags = torch.zeros(comm.world_size, device=device)
    flags[comm.rank] = 1.0 if active else 0.0
    comm.all_reduce(flags, op="join_flags")
    active_ranks = [r for r in range(comm.world_size) if flags[r] > 0]
    if not active_ranks:
        return
    for joined in (r for r in range(comm.world_size) if flags[r] == 0):
        shards = [s for s in partition.shards_of(joined) if params[s.param].requires_grad]
        if not shards:
            continue
        first = params[shards[0].param]
        buffer = torch.zeros(sum(s.numel for s in shards), dtype=first.dtype, device=first.device)
        offset = 0
        for shard in shards:
            grad = params[shard.param].grad
            if comm.rank == active_ranks[0] and grad is not None:
                buffer[offset : offset + shard.numel].copy_(grad.reshape(-1)[shard.start : shard.stop])
            offset += shard.numel
        comm.broadcast_many([(buffer, active_ranks[0])], op="join_grads")
        if comm.rank != joined:
            continue
        offset = 0
        for shard in shards:
            param = params[shard.param]
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            param.grad.reshape(-1)[shard.start : shard.stop].copy_(buffer[offset : offset + shard.numel])
            offset += shard.numel
