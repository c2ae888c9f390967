"""Partitioners: who owns which parameter (or which slice of it).

A partitioner is a pure function ``(specs, world_size) -> Partition``. It sees only
:class:`ParamSpec` records (sizes, dtypes, group indices, names) — never tensors or a
process group — so every partition is unit-testable at any simulated scale::

    specs = [ParamSpec(numel=n) for n in (4_000_000, 2_000, 2_000)]
    partition = SortedGreedy()(specs, world_size=1024)
    print(partition.report())

Balance is by a *cost* per parameter (:data:`Cost`): ``"numel"`` (the default, the
memory its state takes and the work of an elementwise step), ``"newton_schulz"``
(``max(m,n)·min(m,n)²`` for a 2-D parameter stepped by a non-elementwise matrix
optimizer such as ``torch.optim.Muon``, numel otherwise) or any callable
``ParamSpec -> number``; :class:`SortedGreedy`, :class:`Manual` and :class:`DdpBucket`
take ``cost=``, and :meth:`Partition.report` shows memory and cost per rank::

    SortedGreedy(cost="newton_schulz")(specs, world_size=8).report()

A :class:`Partition` is a tiling of every parameter's flattened elements by
:class:`Shard` ranges ``[start, stop)``, each owned by one rank. Whole-parameter
partitioners (:class:`SortedGreedy`, :class:`Manual`) emit one full-range shard per
parameter; the element-granular :class:`Flat` cuts parameters, so a parameter may
straddle ranks, and also records the contiguous buffer layouts its ranges live in.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import heapq
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "COSTS",
    "BucketLayout",
    "BucketUse",
    "Cost",
    "DdpBucket",
    "Flat",
    "Manual",
    "ParamSpec",
    "Partition",
    "PartitionReport",
    "Partitioner",
    "Shard",
    "SortedGreedy",
    "WithoutGradients",
    "bucket_use",
    "contiguous_split",
    "newton_schulz_cost",
    "numel_cost",
    "resolve_cost",
    "state_load",
]


@dataclass(frozen=True)
class ParamSpec:
    """What a partitioner may know about one parameter.

    ``kind`` names the contiguous-buffer class the parameter can share ("cpu/float32");
    ``key`` is an opaque identity (``id`` of the tensor) used only to match parameters a
    user listed as tensors; ``bucket`` is the DDP gradient-bucket index, when known.
    The step's cost inputs: ``shape`` (the parameter's shape; ``(numel,)`` when not
    given), ``elementwise`` (whether the optimizer class that steps it updates each
    element from that element alone, :func:`zero_lab.elementwise.is_elementwise`) and
    ``stepper`` (that class's name, for reports and user costs). ``gets_grad=False`` marks a
    parameter known never to receive a gradient (a layer the forward never uses, found by a
    forward/backward on meta tensors and marked by :class:`WithoutGradients`): it never
    gets optimizer state, so it loads its owner with nothing (:func:`state_load`) and
    :class:`Flat` keeps it out of the buffers whose cuts balance the rest.
    """

    numel: int
    itemsize: int = 4
    group: int = 0
    name: str | None = None
    kind: str = "cpu/float32"
    trainable: bool = True
    key: int | None = None
    bucket: int | None = None
    shape: tuple[int, ...] = ()
    elementwise: bool = True
    stepper: str = ""
    gets_grad: bool = True

    def __post_init__(self) -> None:
        if not self.shape:
            object.__setattr__(self, "shape", (self.numel,))
        elif math.prod(self.shape) != self.numel:
            raise ValueError(f"ParamSpec shape {self.shape} does not hold numel={self.numel} elements")

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @classmethod
    def of(
        cls,
        tensor: Any,
        name: str | None = None,
        group: int = 0,
        device: Any = None,
        bucket: int | None = None,
        elementwise: bool = True,
        stepper: str = "",
        gets_grad: bool = True,
    ) -> ParamSpec:
        """The spec of one parameter tensor (a ``meta`` tensor works: only its metadata is read).

        ``device`` names where the real run keeps the parameter when it differs from the
        tensor's (planning from a meta model); it is part of ``kind``, which buffers never mix.
        """
        return cls(
            numel=tensor.numel(),
            itemsize=tensor.element_size(),
            group=group,
            name=name,
            kind=f"{device if device is not None else tensor.device}/{tensor.dtype}",
            trainable=tensor.requires_grad,
            key=id(tensor),
            bucket=bucket,
            shape=tuple(tensor.shape) if tensor.dim() else (1,),
            elementwise=elementwise,
            stepper=stepper,
            gets_grad=gets_grad,
        )


#: What one parameter's step costs, for balancing: ``ParamSpec -> number`` (larger = more work).
Cost = Callable[[ParamSpec], float]


def numel_cost(spec: ParamSpec) -> int:
    """The parameter's element count: its state's size and an elementwise step's work."""
    return spec.numel


def newton_schulz_cost(spec: ParamSpec) -> int:
    """``max(m,n)·min(m,n)²`` for a 2-D parameter stepped by a non-elementwise optimizer, else numel.

    Newton–Schulz orthogonalisation (``torch.optim.Muon``) runs ``ns_steps`` rounds of
    three matmuls on the ``min × max`` oriented matrix, each dominated by
    ``min(m,n)² · max(m,n)`` multiply-adds; an elementwise step (AdamW on embeddings,
    norms, biases) is linear in numel.
    """
    if spec.elementwise or len(spec.shape) != 2:
        return spec.numel
    m, n = spec.shape
    return max(m, n) * min(m, n) ** 2


#: The named costs accepted wherever ``cost=`` is (the app's ``partitioner.cost``).
COSTS: dict[str, Cost] = {"numel": numel_cost, "newton_schulz": newton_schulz_cost}


def state_load(price: Cost, spec: ParamSpec) -> float:
    """What ``spec`` adds to its owner's load: its ``price``, or nothing for a parameter that
    never receives a gradient (``gets_grad=False``: it never gets state, nor a step)."""
    return price(spec) if spec.gets_grad else 0


def resolve_cost(cost: str | Cost | None) -> Cost:
    """``None`` or ``"numel"`` → :func:`numel_cost`; a name in :data:`COSTS`; or a callable as given."""
    if cost is None:
        return numel_cost
    if isinstance(cost, str):
        if cost not in COSTS:
            raise ValueError(f"cost={cost!r} is not one of {sorted(COSTS)}; or pass a callable ParamSpec -> number")
        return COSTS[cost]
    if not callable(cost):
        raise TypeError(f"cost must be one of {sorted(COSTS)} or a callable ParamSpec -> number, got {cost!r}")
    return cost


def _cost_name(cost: Cost) -> str:
    for name, known in COSTS.items():
        if cost is known:
            return name
    return getattr(cost, "__name__", repr(cost))


@dataclass(frozen=True)
class Shard:
    """Elements ``[start, stop)`` of parameter ``param`` (flattened), owned by ``rank``."""

    param: int
    rank: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class BucketLayout:
    """A contiguous buffer holding ``params`` at ``offsets``; rank r owns ``bounds[r]``.

    Buffers never mix kinds (device + dtype) or param groups. The exchange moves each
    buffer with one broadcast per rank's range or one all-gather (``exchange=``, see
    :mod:`zero_lab.exchange`).
    """

    kind: str
    group: int
    params: tuple[int, ...]
    offsets: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    numel: int


@dataclass(frozen=True)
class PartitionReport:
    """Per-rank load of a partition: memory (``imbalance`` = max / (total / world_size)
    of the elements) and step cost (``cost_imbalance``, the same ratio of the partition's
    cost; a cut parameter's cost is shared in proportion to its elements)."""

    numel_per_rank: tuple[int, ...]
    bytes_per_rank: tuple[int, ...]
    imbalance: float
    cost_per_rank: tuple[float, ...] = ()
    cost_imbalance: float = 1.0
    cost: str = "numel"

    def as_dict(self) -> dict[str, Any]:
        return {
            "numel_per_rank": list(self.numel_per_rank),
            "bytes_per_rank": list(self.bytes_per_rank),
            "imbalance": self.imbalance,
            "cost": self.cost,
            "cost_per_rank": list(self.cost_per_rank),
            "cost_imbalance": self.cost_imbalance,
        }

    def __str__(self) -> str:
        costs = self.cost_per_rank or (0,) * len(self.numel_per_rank)
        rows = [f"{'rank':>6} {'numel':>14} {'bytes':>14} {'cost (' + self.cost + ')':>20}"]
        rows += [
            f"{r:>6} {n:>14,} {b:>14,} {c:>20,.0f}"
            for r, (n, b, c) in enumerate(zip(self.numel_per_rank, self.bytes_per_rank, costs))
        ]
        rows.append(f"imbalance (max/ideal): memory {self.imbalance:.4f}, cost {self.cost_imbalance:.4f}")
        return "\n".join(rows)


@dataclass(frozen=True)
class Partition:
    """A tiling of every parameter's elements by shards; validated on construction."""

    specs: tuple[ParamSpec, ...]
    world_size: int
    shards: tuple[Shard, ...]
    layouts: tuple[BucketLayout, ...] = ()
    cost: Cost = field(default=numel_cost, compare=False)
    _by_rank: tuple[tuple[Shard, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        covered = [0] * len(self.specs)
        by_rank: list[list[Shard]] = [[] for _ in range(self.world_size)]
        for shard in sorted(self.shards, key=lambda s: (s.param, s.start)):
            if not 0 <= shard.rank < self.world_size:
                raise ValueError(f"shard {shard} names rank outside [0, {self.world_size})")
            if shard.start != covered[shard.param] or shard.stop <= shard.start:
                raise ValueError(f"shards of parameter {shard.param} do not tile it: {shard}")
            covered[shard.param] = shard.stop
            by_rank[shard.rank].append(shard)
        for index, spec in enumerate(self.specs):
            if covered[index] != spec.numel and spec.numel > 0:
                raise ValueError(f"parameter {index} is covered up to {covered[index]} of {spec.numel}")
        object.__setattr__(self, "_by_rank", tuple(tuple(s) for s in by_rank))

    def shards_of(self, rank: int) -> tuple[Shard, ...]:
        """This rank's shards, in global parameter order."""
        return self._by_rank[rank]

    @property
    def is_whole(self) -> bool:
        """True when no parameter is cut (every shard is a full parameter)."""
        return not self.cut_params()

    def cut_params(self) -> list[int]:
        """Indices of the parameters cut into element ranges (a shard short of the whole), sorted."""
        return sorted({s.param for s in self.shards if s.start != 0 or s.stop != self.specs[s.param].numel})

    def owners(self) -> list[int]:
        """Owner rank of each parameter; only for whole-parameter partitions."""
        if not self.is_whole:
            raise ValueError("owners() needs a whole-parameter partition; this one cuts parameters")
        owner = [0] * len(self.specs)
        for shard in self.shards:
            owner[shard.param] = shard.rank
        return owner

    def report(self, cost: str | Cost | None = None) -> PartitionReport:
        """Elements, bytes and cost per rank; ``cost`` defaults to the one the partition was made by."""
        price = self.cost if cost is None else resolve_cost(cost)
        numel = [0] * self.world_size
        nbytes = [0] * self.world_size
        costs = [0.0] * self.world_size
        for shard in self.shards:
            spec = self.specs[shard.param]
            numel[shard.rank] += shard.numel
            nbytes[shard.rank] += shard.numel * spec.itemsize
            costs[shard.rank] += state_load(price, spec) * shard.numel / spec.numel
        ideal = sum(numel) / self.world_size
        imbalance = max(numel) / ideal if ideal else 1.0
        ideal_cost = sum(costs) / self.world_size
        cost_imbalance = max(costs) / ideal_cost if ideal_cost else 1.0
        return PartitionReport(tuple(numel), tuple(nbytes), imbalance, tuple(costs), cost_imbalance, _cost_name(price))


@runtime_checkable
class Partitioner(Protocol):
    """Maps parameter specs and a world size to a :class:`Partition`.

    Must be deterministic (every rank computes it independently) and *stable under
    appended groups*: adding a param group must not move earlier groups' shards.
    ``needs_ddp_buckets``: the partition follows ``ParamSpec.bucket`` (DDP's gradient
    buckets, :mod:`zero_lab.ddp_buckets`), known only with overlap; without them it would be refused.
    ``shard_buckets``: with DDP's buckets, a bucket's elements are cut across the ranks rather
    than given wholly to one (torch's ``hook_with_zero_step(shard_buckets=)``; the overlap hook
    of that name sets it on a copy); ``False`` for a partitioner that ignores buckets.
    Both are optional: a class that declares neither ignores DDP's buckets, and
    :func:`bucket_use` is the one place that reads them.
    """

    needs_ddp_buckets: bool
    shard_buckets: bool

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition: ...


class BucketUse(NamedTuple):
    """How a partitioner uses DDP's gradient buckets (:class:`Partitioner`'s two optional members)."""

    needs_ddp_buckets: bool
    shard_buckets: bool


def bucket_use(partitioner: Any) -> BucketUse:
    """The partitioner's (or its class's) :class:`BucketUse`; ``False`` for what it does not declare."""
    return BucketUse(
        bool(getattr(partitioner, "needs_ddp_buckets", False)), bool(getattr(partitioner, "shard_buckets", False))
    )


def _check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")


def _whole(specs: Sequence[ParamSpec], owners: Sequence[int], world_size: int, cost: Cost = numel_cost) -> Partition:
    shards = tuple(Shard(i, r, 0, spec.numel) for i, (spec, r) in enumerate(zip(specs, owners)) if spec.numel > 0)
    return Partition(tuple(specs), world_size, shards, cost=cost)


class SortedGreedy:
    """Largest parameter first, each to the least-loaded rank (ties: lowest rank): LPT.

    Groups are processed in order with loads carried across them, parameters sorted
    by cost descending (stable) inside each group. With the default ``cost="numel"``
    this is exactly the assignment of ``torch.distributed.optim.ZeroRedundancyOptimizer``;
    with ``cost="newton_schulz"`` it balances Muon's step instead (LPT: the largest
    job to the least-loaded machine, within 4/3 of the optimal makespan). A heap keeps
    it O(n log n + n log W).

        SortedGreedy(cost="newton_schulz")(specs, world_size=64)
    """

    needs_ddp_buckets = False
    shard_buckets = False

    def __init__(self, cost: str | Cost | None = "numel"):
        self.cost = cost
        self._price = resolve_cost(cost)

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition:
        _check_world_size(world_size)
        owners = self.assign([state_load(self._price, s) for s in specs], [s.group for s in specs], world_size)
        return _whole(specs, owners, world_size, self._price)

    @staticmethod
    def assign(
        sizes: Sequence[int],
        groups: Sequence[int],
        world_size: int,
        loads: Sequence[int] | None = None,
    ) -> list[int]:
        """Owner of each size; ``loads`` seeds the per-rank loads (default zeros)."""
        heap = [(load, rank) for rank, load in enumerate(loads or [0] * world_size)]
        heapq.heapify(heap)
        owners = [0] * len(sizes)
        by_group: dict[int, list[int]] = {}
        for index, group in enumerate(groups):
            by_group.setdefault(group, []).append(index)
        for group in sorted(by_group):
            for index in sorted(by_group[group], key=lambda i: sizes[i], reverse=True):
                load, rank = heapq.heappop(heap)
                owners[index] = rank
                heapq.heappush(heap, (load + sizes[index], rank))
        return owners

    def __repr__(self) -> str:
        return "SortedGreedy()" if self.cost in (None, "numel") else f"SortedGreedy(cost={self.cost!r})"


def _pattern_matcher(pattern: str):
    if pattern.startswith("re:"):
        regex = re.compile(pattern[3:])
        return lambda name: regex.fullmatch(name) is not None
    return lambda name: fnmatch.fnmatchcase(name, pattern)


class Manual:
    """The user says which rank owns which parameters, in one of two ways.

    ``params_per_rank[r]`` lists rank r's parameters as name patterns — globs such as
    ``"encoder.*"`` or regexes as ``"re:layers\\.[0-3]\\..*"`` matched against the names
    from ``model.named_parameters()`` — or as the tensors themselves; it fixes the world
    size. ``order`` is world-size free: ordered name patterns (``["embed*", "layers.*",
    "head*"]``) put the parameters in a sequence (each parameter at its first matching
    pattern, in model order inside a pattern), which is cut into ``world_size`` contiguous
    runs with the smallest possible largest run (:func:`contiguous_split`), so neighbours
    stay together at any W. Give at least one; ``params_per_rank``, when given, is used
    and ``order`` is not (so a config can keep a default ``order``).

    Every trainable parameter must be owned exactly once; frozen parameters nobody lists
    go to the least-loaded rank. Errors name the offending pattern, parameter or rank.
    ``cost`` (``"numel"``, ``"newton_schulz"`` or a callable, see :data:`Cost`) is what
    the ``order`` split and the frozen parameters' placement balance.

        Manual(order=["tok_emb.*", "blocks.*", "head.*"])(specs, world_size=64)
    """

    needs_ddp_buckets = False
    shard_buckets = False

    def __init__(
        self,
        params_per_rank: Sequence[Sequence[Any]] | None = None,
        order: Sequence[str] | None = None,
        cost: str | Cost | None = "numel",
    ):
        self.cost = cost
        self._price = resolve_cost(cost)
        if params_per_rank is None and order is None:
            raise ValueError(
                "Manual needs params_per_rank (one list of names per rank) or order "
                "(ordered name patterns, cut into world_size contiguous runs)"
            )
        if params_per_rank is not None and (
            isinstance(params_per_rank, (str, bytes)) or not isinstance(params_per_rank, Iterable)
        ):
            raise TypeError("params_per_rank must be a list (one entry per rank) of lists of names or tensors")
        if params_per_rank is None and (isinstance(order, (str, bytes)) or not all(isinstance(p, str) for p in order)):  # type: ignore[union-attr]
            raise TypeError(f"order must be a list of name patterns (globs or 're:<regex>'), got {order!r}")
        self.params_per_rank = None if params_per_rank is None else [list(entries) for entries in params_per_rank]
        self.order = None if order is None or params_per_rank is not None else list(order)

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition:
        _check_world_size(world_size)
        owner = (
            self._owners_in_order(specs, world_size)
            if self.order is not None
            else self._owners_listed(specs, world_size)
        )
        missing = [i for i, s in enumerate(specs) if i not in owner and s.trainable]
        if missing:
            names = ", ".join(_label(specs, i) for i in missing[:8])
            given = "order" if self.order is not None else "params_per_rank"
            raise ValueError(f"{given} leaves trainable parameters without an owner: {names}")
        loads = [0] * world_size
        for index, rank in owner.items():
            loads[rank] += state_load(self._price, specs[index])
        frozen = [i for i in range(len(specs)) if i not in owner]
        extra = SortedGreedy.assign(
            [state_load(self._price, specs[i]) for i in frozen], [0] * len(frozen), world_size, loads
        )
        owner.update(zip(frozen, extra))
        return _whole(specs, [owner[i] for i in range(len(specs))], world_size, self._price)

    def _owners_listed(self, specs: Sequence[ParamSpec], world_size: int) -> dict[int, int]:
        assert self.params_per_rank is not None
        if len(self.params_per_rank) != world_size:
            raise ValueError(
                f"params_per_rank has {len(self.params_per_rank)} entries but world_size is {world_size}: give "
                "exactly one list of name patterns per rank (a list of lists), or give `order` instead, which "
                "fits any world size"
            )
        owner: dict[int, int] = {}
        by_key = {spec.key: i for i, spec in enumerate(specs) if spec.key is not None}
        for rank, entries in enumerate(self.params_per_rank):
            for entry in entries:
                for index in self._resolve(entry, specs, by_key):
                    if owner.get(index, rank) != rank:
                        raise ValueError(
                            f"parameter {_label(specs, index)} is listed for rank {owner[index]} and rank {rank}: "
                            "each parameter must be owned by exactly one rank"
                        )
                    owner[index] = rank
        return owner

    def _owners_in_order(self, specs: Sequence[ParamSpec], world_size: int) -> dict[int, int]:
        assert self.order is not None
        sequence: list[int] = []
        placed: set[int] = set()
        for pattern in self.order:
            found = [i for i in self._resolve(pattern, specs, {}) if i not in placed and specs[i].trainable]
            sequence.extend(found)
            placed.update(found)
        runs = contiguous_split([state_load(self._price, specs[i]) for i in sequence], world_size)
        return {index: rank for index, rank in zip(sequence, runs)}

    @staticmethod
    def _resolve(entry: Any, specs: Sequence[ParamSpec], by_key: dict[int, int]) -> list[int]:
        if isinstance(entry, str):
            if all(spec.name is None for spec in specs):
                raise ValueError(
                    f"pattern {entry!r} needs parameter names: build the optimizer from model.named_parameters()"
                )
            try:
                match = _pattern_matcher(entry)
            except re.error as error:
                raise ValueError(f"pattern {entry!r} is not a valid regular expression: {error}") from None
            found = [i for i, spec in enumerate(specs) if spec.name is not None and match(spec.name)]
            if not found:
                raise ValueError(f"pattern {entry!r} matches no parameter name")
            return found
        if id(entry) not in by_key:
            raise ValueError(
                "params_per_rank lists a tensor that was not passed to the optimizer "
                f"(shape {tuple(getattr(entry, 'shape', ()))})"
            )
        return [by_key[id(entry)]]

    def __repr__(self) -> str:
        cost = "" if self.cost in (None, "numel") else f", cost={self.cost!r}"
        if self.order is not None:
            return f"Manual(order={self.order!r}{cost})"
        return f"Manual(params_per_rank={self.params_per_rank!r}{cost})"


def contiguous_split(sizes: Sequence[float], world_size: int) -> list[int]:
    """Rank of each size when ``sizes``, in order, are cut into ``world_size`` contiguous runs.

    Minimises the largest run (the linear-partition problem): binary search on the cap
    ``L`` with a greedy feasibility test (fill a run while it stays <= L), then cut with
    the smallest feasible ``L``, starting a new run early only when the remaining sizes
    are just enough to give every remaining rank one. Ranks stay in order (rank r's run
    comes before rank r+1's); with fewer sizes than ranks the last ranks own nothing.
    O(n log(sum)).
    """
    _check_world_size(world_size)
    if not sizes:
        return []
    if not all(isinstance(size, int) for size in sizes):  # a user cost's floats: search on a fixed-point scale
        sizes = [math.ceil(size * 2**20) for size in sizes]

    def runs_needed(cap: int) -> int:
        runs, filled = 1, 0
        for size in sizes:
            if filled + size > cap:
                runs, filled = runs + 1, 0
            filled += size
        return runs

    low, high = max(sizes), sum(sizes)
    while low < high:
        middle = (low + high) // 2
        if runs_needed(middle) <= world_size:
            high = middle
        else:
            low = middle + 1
    ranks, rank, filled = [], 0, 0
    for index, size in enumerate(sizes):
        left = len(sizes) - index  # sizes still to place, this one included
        if filled and (filled + size > low or left <= world_size - 1 - rank):
            rank, filled = rank + 1, 0
        ranks.append(rank)
        filled += size
    return ranks


def _label(specs: Sequence[ParamSpec], index: int) -> str:
    return repr(specs[index].name) if specs[index].name is not None else f"#{index}"


class Flat:
    """Element-granular partition: padded buffers per (param group, kind), each cut evenly.

    Parameters of a group and kind are laid out in registration order in buffers of
    ``n`` elements, each padded to ``W * ceil(n / W)``; in each buffer rank r owns
    ``[r*c, (r+1)*c)`` with ``c = ceil(n / W)``, so a parameter may straddle ranks and
    every rank's load is within one element per buffer of ``total / W`` (padding
    belongs to no one). Without ``bucket_cap_mb`` a group and kind is one buffer; with
    it, a buffer is closed before the module (the consecutive parameters sharing a name
    prefix; each parameter when unnamed) that would take it past the cap, and a module
    larger than the cap gets a buffer of its own, so parameters never straddle buffers.
    Several buffers in forward order are what lets
    :func:`~zero_lab.overlap.prefetch_exchange` hide the exchange: the first layer
    waits only for its own buffer while the later ones are still in flight. The
    exchange moves each buffer with one collective per rank (broadcast) or one
    all-gather, whichever ``exchange=`` picks. Cutting needs an elementwise optimizer:
    a parameter whose ``ParamSpec.elementwise`` is false (stepped by Muon, Adafactor, ...)
    is refused, naming it (put it under a whole-parameter partitioner instead).
    """

    needs_ddp_buckets = False
    shard_buckets = False

    def __init__(self, bucket_cap_mb: float | None = None):
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise ValueError(
                f"bucket_cap_mb={bucket_cap_mb!r} must be a positive number of MiB, or None for one buffer "
                "per param group and dtype"
            )
        self.bucket_cap_mb = bucket_cap_mb

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition:
        _check_world_size(world_size)
        whole_only = [i for i, spec in enumerate(specs) if not spec.elementwise]
        if whole_only:
            first = specs[whole_only[0]]
            raise ValueError(
                f"Flat cuts parameter {_label(specs, whole_only[0])} (shape {first.shape}, group {first.group}) into "
                f"element ranges, which needs an elementwise optimizer; {first.stepper or 'its optimizer'} is not "
                f"one ({len(whole_only)} such parameter(s)). Use a whole-parameter partitioner "
                "(SortedGreedy(cost='newton_schulz'), Manual), or declare the class elementwise "
                "(zero_lab.register_elementwise) if its update really is per element"
            )
        buffers: dict[tuple[int, str, bool], list[int]] = {}
        for index, spec in enumerate(specs):  # parameters without gradients apart: they would skew the cut
            buffers.setdefault((spec.group, spec.kind, spec.gets_grad), []).append(index)
        shards: list[Shard] = []
        layouts: list[BucketLayout] = []
        for (group, kind, _), members in sorted(buffers.items(), key=lambda kv: kv[1][0]):
            for bucket in self._capped(members, specs):
                offsets, total = [], 0
                for index in bucket:
                    offsets.append(total)
                    total += specs[index].numel
                if total == 0:
                    continue
                chunk = math.ceil(total / world_size)
                bounds = tuple((r * chunk, (r + 1) * chunk) for r in range(world_size))
                layouts.append(BucketLayout(kind, group, tuple(bucket), tuple(offsets), bounds, chunk * world_size))
                for index, offset in zip(bucket, offsets):
                    shards.extend(_cut(index, offset, specs[index].numel, chunk, world_size))
        return Partition(tuple(specs), world_size, tuple(shards), tuple(layouts))

    def _capped(self, members: Sequence[int], specs: Sequence[ParamSpec]) -> list[list[int]]:
        """``members`` (in order) cut into runs of at most ``bucket_cap_mb`` MiB (one run without a cap).

        Consecutive parameters of one module (same name up to the last dot) stay together,
        so a layer's weight and bias share a buffer; a module larger than the cap gets one
        of its own. Without names every parameter is its own unit.
        """
        if self.bucket_cap_mb is None:
            return [list(members)]
        cap = self.bucket_cap_mb * 1024 * 1024
        modules: list[list[int]] = []
        previous: str | None = None
        for index in members:
            name = specs[index].name
            owner = name.rsplit(".", 1)[0] if name and "." in name else None
            if owner is not None and owner == previous:
                modules[-1].append(index)
            else:
                modules.append([index])
            previous = owner
        runs: list[list[int]] = [[]]
        filled = 0
        for module in modules:
            size = sum(specs[i].nbytes for i in module)
            if runs[-1] and filled + size > cap:
                runs.append([])
                filled = 0
            runs[-1].extend(module)
            filled += size
        return runs

    def __repr__(self) -> str:
        return "Flat()" if self.bucket_cap_mb is None else f"Flat(bucket_cap_mb={self.bucket_cap_mb!r})"


def _cut(index: int, offset: int, numel: int, chunk: int, world_size: int) -> list[Shard]:
    """Shards of the parameter at buffer ``[offset, offset+numel)`` against ranges of ``chunk``."""
    shards = []
    first, last = offset // chunk, (offset + numel - 1) // chunk
    for rank in range(first, min(last, world_size - 1) + 1):
        lo = max(offset, rank * chunk) - offset
        hi = min(offset + numel, (rank + 1) * chunk) - offset
        if hi > lo:
            shards.append(Shard(index, rank, lo, hi))
    return shards


class DdpBucket:
    """Follow DDP's gradient buckets, so each bucket can be stepped when its all-reduce ends.

    Without ``shard_buckets`` each bucket goes wholly to the least-loaded rank (buckets
    in index order). With ``shard_buckets`` every bucket's parameters, in order, are
    cut into W contiguous runs of whole parameters of about ``bucket/W`` elements, so
    every rank steps a part of every bucket. Parameters outside DDP's buckets (frozen)
    are placed by sorted-greedy afterwards. ``needs_ddp_buckets``: the specs must carry
    ``bucket`` indices (the optimizer's ``ddp_buckets=``, or the overlap hook when it
    attaches first); without any, every parameter would fall back to sorted-greedy.
    ``cost`` (see :data:`Cost`) is the load the buckets and the split balance.
    """

    needs_ddp_buckets = True

    def __init__(self, shard_buckets: bool = False, cost: str | Cost | None = "numel"):
        self.shard_buckets = shard_buckets
        self.cost = cost
        self._price = resolve_cost(cost)

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition:
        _check_world_size(world_size)
        members: dict[int, list[int]] = {}
        for index, spec in enumerate(specs):
            if spec.bucket is not None:
                members.setdefault(spec.bucket, []).append(index)
        owner: dict[int, int] = {}
        loads = [0] * world_size
        for bucket in sorted(members):
            params = members[bucket]
            if self.shard_buckets:
                self._split(params, [state_load(self._price, specs[i]) for i in params], world_size, owner, loads)
            else:
                rank = loads.index(min(loads))
                for index in params:
                    owner[index] = rank
                    loads[rank] += state_load(self._price, specs[index])
        rest = [i for i in range(len(specs)) if i not in owner]
        placed = SortedGreedy.assign(
            [state_load(self._price, specs[i]) for i in rest], [specs[i].group for i in rest], world_size, loads
        )
        owner.update(zip(rest, placed))
        return _whole(specs, [owner[i] for i in range(len(specs))], world_size, self._price)

    @staticmethod
    def _split(
        params: list[int], costs: list[float], world_size: int, owner: dict[int, int], loads: list[float]
    ) -> None:
        total = sum(costs)
        # Ranks take the runs least-loaded first, so small buckets do not always land on rank 0.
        order = sorted(range(world_size), key=lambda r: (loads[r], r))
        done = 0.0
        for index, cost in zip(params, costs):
            midpoint = done + cost / 2
            slot = min(int(midpoint * world_size / total), world_size - 1) if total else 0
            rank = order[slot]
            owner[index] = rank
            loads[rank] += cost
            done += cost

    def __repr__(self) -> str:
        cost = "" if self.cost in (None, "numel") else f", cost={self.cost!r}"
        return f"DdpBucket(shard_buckets={self.shard_buckets}{cost})"


class WithoutGradients:
    """``inner``, told which parameters never receive a gradient: it sees their specs with
    ``gets_grad=False`` (matched by name, or by tensor ``id`` as ``ParamSpec.key``), so they load
    their owner with nothing and the owners balance the parameters that get state.

    For parameters known before the first step never to be used (the app finds them with a forward and
    backward on ``meta`` tensors, :attr:`zero_lab.app.plan.run_plan.RunPlan.never_reached`): pricing them as if
    they got state left one rank of the own-model example holding all of it. Give it to the
    optimizer's constructor: ``partitioner=WithoutGradients(SortedGreedy(), names)``.
    DDP-bucket use (``needs_ddp_buckets``, ``shard_buckets``) is ``inner``'s; ``repr`` is ``inner``'s
    with the parameters named.
    """

    def __init__(self, inner: Partitioner, params: Iterable[Any]):
        self.inner = inner
        self.names = frozenset(p for p in params if isinstance(p, str))
        self.keys = frozenset(id(p) for p in params if not isinstance(p, str))

    @property
    def needs_ddp_buckets(self) -> bool:
        return bucket_use(self.inner).needs_ddp_buckets

    @property
    def shard_buckets(self) -> bool:
        return bucket_use(self.inner).shard_buckets

    @shard_buckets.setter
    def shard_buckets(self, value: bool) -> None:  # a copy of this wrapper set apart (attach_ddp) copies inner too
        self.inner = copy.copy(self.inner)
        self.inner.shard_buckets = value  # type: ignore[attr-defined]

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition:
        marked = [
            dataclasses.replace(spec, gets_grad=False) if spec.name in self.names or spec.key in self.keys else spec
            for spec in specs
        ]
        return self.inner(marked, world_size)

    def __repr__(self) -> str:
        return f"WithoutGradients({self.inner!r}, {sorted(self.names)!r})"
