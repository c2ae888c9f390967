"""Predict one training step's time and traffic, per phase, at any world size (pure: no processes).

Beside the memory planner (:mod:`zero_lab.planner`): the *real* partitioner runs on the
model's :class:`~zero_lab.partition.ParamSpec` records at the predicted world size, so the
owners' imbalance is the one a run would have, and every collective is priced with
:mod:`zero_lab.collective_cost` (α-β per link class, nccl-tests' bus-bandwidth factors)::

    specs = specs_from_module(meta_model)
    p = predict_step(specs, STRATEGIES["zero1_flat"], h100, world_size=512, samples_per_rank=8192, shard_size=8)
    print(p.seconds, [(ph.name, ph.exposed_s) for ph in p.phases])

**Phases of a step** (``W`` ranks, sharded over groups of ``S`` = ``shard_size`` ranks, ``Ψ``
the trainable bytes):

1. *compute* (:func:`compute_seconds`) — forward ``2·F`` and backward ``4·F`` FLOPs, ``F`` =
   trainable parameters × samples (tokens) per rank (6 FLOPs per parameter per token; attention
   scores left out), at the hardware's ``matmul_flops``, **plus** one read of every parameter
   per pass (the forward's and the backward's matmuls each stream the weights: ``Ψ_all`` bytes
   each) at ``memory_bandwidth``. Added, not overlapped: at a data-parallel rank's batch sizes a
   CPU thread does not hide its weight loads behind its arithmetic. Measured here
   (``scripts/time_passes.py``: forward + backward under ``no_sync``, W=1): 12.1–12.9 ms for
   linear768 and 28.0–29.1 ms for tutorial-quick; on the committed profile FLOPs alone price them
   8.0 and 22.5 ms, FLOPs and one read per pass 11.0 and 29.4 ms. The backward's gradient
   writes are left out (counted, they over-price both backwards by 10–20 %: the stores do not
   stall the arithmetic as the loads do). On an H100
   (``h100_ib``) GPT-2 1.5 B at 8,192 tokens per rank adds 3.7 ms to 155 ms of FLOPs; the
   tutorial MLP at 20 rows per rank is weight-bound there (0.19 ms of weights, 0.02 of FLOPs).
   On a CPU host with fewer cores than ranks, a rank's forward and backward run at its even
   share of the profile's single-rank rates (``cores / W``), not at the crowded world's rates:
   those are timed with every rank doing one kind of work at once, and their Adam rate is the
   least stable figure of a calibration (6.4, 8.7 and 6.0 GB/s per rank in three idle
   calibrations within two and a half hours, the single-rank rates within 4 %). Measured here,
   forward + backward at W=4 on 2 cores took 2.17–2.26 × (linear768) and 2.17–2.20 ×
   (tutorial-quick) their W=1 time; the even share prices 2 ×, those calibrations' crowded rates
   2.25–2.65 ×. The owner's step and every collective take the crowded world as measured (see
   *Crowded hosts* below).
2. *gradient reduction*, per DDP bucket (:class:`~zero_lab.ddp_buckets.DdpBuckets`, 25 MiB):
   ``all_reduce`` (DDP: every rank gets every sum); ``reduce_scatter`` (zero_lab's
   ``grad_reduce=reduce_scatter`` on DDP's buckets, point to point: each rank sends every owner
   its segment, an owner receives ``W-1`` contributions, all in flight at once, and adds them;
   the busiest rank's sends and receives set the time, :func:`p2p_busiest`: the larger of the
   two on a ``duplex`` link, their mean at a swap's rate where one thread copies both, as Gloo
   here — except inside one crowded host (ranks > cores, the group on one node), where the ranks
   take turns on the cores and the bucket's total copies set the time, as if its segments were
   equal (measured here at W=4 on 2 cores: the tutorial's buckets, each owned by one or two
   ranks, reduce in about the time of equal segments, not in twice it, as their busiest rank's
   load would say; a group spanning nodes keeps the busiest rank, whose link carries its bytes
   whatever the cores do); priced with the
   profile's ``p2p_reduce_scatter`` fit, the strategy itself timed by the calibration with its
   receive buffers and adds, else as one ``send_recv`` of those bytes);
   ``reduce_scatter_native`` (one ``reduce_scatter_tensor`` per bucket, segments padded to the
   longest: ``W × longest`` — a bucket owned by few ranks costs W times its size); ``owned``
   (an engine whose buffers are cut evenly among the owners: one reduce-scatter of the bucket).
   *grad copies* beside it (:data:`BUCKET_COPY_TOUCHES`: DDP's into and out of its buckets, the
   engine's into its buffer) at the memory bandwidth, exposed (the same cores).
   With ``S < W`` the reduce-scatter runs inside the group and each owner's shard is then
   all-reduced across the ``W/S`` groups (``Ψ/S`` per rank crosses groups).
3. *the owner's step* — Adam reads the parameter, gradient and two moments and writes three
   (7 touches per element); Muon (non-elementwise specs) runs Newton–Schulz, ``ns_steps`` ×
   (``4a²b + 2a³``) FLOPs on an ``a × b`` matrix (``a ≤ b``), plus 5 touches per element. Every
   rank steps its owned shards; the slowest rank's load counts (the partition's real cost
   imbalance). DDP steps everything on every rank.
4. *parameter exchange* inside the group: ``all_gather`` (flat buffers: equal ranges; whole
   parameters: the rank-major buffer padded to the largest owner) or ``broadcast`` (one per
   owner's range, each from its owner).

**Overlap rules.** Gradient reduction runs during backward (DDP issues a bucket when its
gradients are ready): all but the last bucket's reduction may hide behind the backward, up to
``overlap × backward``. The owner's step waits for every gradient and is never hidden. The
exchange is exposed after the step (ZeRO-1), except for an engine that gathers each bucket
before the next forward uses it (``exchange_hidden``): all but its first bucket may hide behind
the forward, up to ``overlap × forward``.

**Crowded hosts.** Ranks that outnumber a host's cores (4 on this machine's 2) take turns on
them with their Gloo threads: a collective measured alone in a world of 4 is not the ring of a
2-rank fit scaled by step counts and bus factors, and a rank computes at its share of the cores.
The collectives and the owner's step are priced on ``hardware.on_host(W)``: the calibration's
own fits and rates for a world of that size (``crowded`` in the profile, measured with every rank
busy at once), the cores shared evenly where it measured none; the forward and backward on the
even share (*compute* above), and a point-to-point reduce-scatter on its bucket's total (*gradient
reduction*). A profile without ``cores`` (a cluster: one device per rank) is unchanged by it.

**Bytes.** Each phase reports its bus bytes per rank on each link class (intra-node,
inter-node) — an average rank's (a point-to-point reduce-scatter's time is its busiest rank's,
its bytes every rank's mean) — and :func:`communicator_bytes` predicts exactly what zero_lab's
:class:`~zero_lab.comm.Communicator` counts on a given rank (``bytes`` and ``sent_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from zero_lab.collective_cost import Collective, Hardware, bytes_by_link, nodes_spanned, seconds
from zero_lab.ddp_buckets import DdpBuckets
from zero_lab.partition import Flat, ParamSpec, Partition, Partitioner, SortedGreedy

__all__ = [
    "ADAM_TOUCHES",
    "GRAD_REDUCES",
    "MUON_TOUCHES",
    "STRATEGIES",
    "ModeledStrategy",
    "Phase",
    "StepPrediction",
    "communicator_bytes",
    "compute_seconds",
    "newton_schulz_flops",
    "p2p_busiest",
    "predict_step",
]

#: Memory touches per element of an Adam step: reads param, grad, exp_avg, exp_avg_sq; writes three.
ADAM_TOUCHES = 7
#: Memory touches per element of a Muon step beside Newton–Schulz: reads grad, momentum, param; writes two.
MUON_TOUCHES = 5
#: Memory touches per gradient element of the copies around the reduction: DDP copies each
#: ``param.grad`` into its bucket and the reduced bucket back (a read and a write each); the
#: engine writes each gradient (÷ W) into its bucket buffer once.
BUCKET_COPY_TOUCHES = {"all_reduce": 4, "reduce_scatter": 4, "reduce_scatter_native": 4, "owned": 2}
#: Newton–Schulz iterations per step (``torch.optim.Muon``'s default ``ns_steps``).
NS_STEPS = 5
#: The calibrated op of ``grad_reduce=reduce_scatter`` (:func:`_p2p_reduce_scatter`).
P2P_REDUCE_SCATTER = "p2p_reduce_scatter"
GRAD_REDUCES = ("all_reduce", "reduce_scatter", "reduce_scatter_native", "owned")
EXCHANGES = ("none", "broadcast", "all_gather")


@dataclass(frozen=True)
class ModeledStrategy:
    """One strategy the model prices; ``partitioner=None`` is DDP (every rank steps everything).

    ``bucket_view``: whole-parameter partitions exchange through one rank-major buffer
    (``parameters_as_bucket_view``) rather than one collective per shard. ``muon``: the specs it
    is priced on mark Muon's matrices non-elementwise (``ParamSpec.elementwise=False``), the rest AdamW.
    """

    name: str
    label: str
    partitioner: Callable[[], Partitioner] | None
    grad_reduce: str = "all_reduce"
    exchange: str = "all_gather"
    exchange_hidden: bool = False
    release_grads: bool = False
    bucket_view: bool = True
    muon: bool = False

    def __post_init__(self) -> None:
        if self.grad_reduce not in GRAD_REDUCES:
            raise ValueError(f"strategy {self.name!r}: grad_reduce={self.grad_reduce!r} is not one of {GRAD_REDUCES}")
        if self.exchange not in EXCHANGES:
            raise ValueError(f"strategy {self.name!r}: exchange={self.exchange!r} is not one of {EXCHANGES}")
        if (self.partitioner is None) != (self.exchange == "none"):
            raise ValueError(f"strategy {self.name!r}: exchange='none' goes with partitioner=None (DDP) only")
        if self.partitioner is None and self.grad_reduce != "all_reduce":
            raise ValueError(f"strategy {self.name!r}: DDP steps every parameter, so it needs grad_reduce='all_reduce'")


def _newton_schulz_greedy() -> Partitioner:
    return SortedGreedy(cost="newton_schulz")


#: The strategies of the at-scale table (Muon rows need specs marked non-elementwise).
STRATEGIES: dict[str, ModeledStrategy] = {
    s.name: s
    for s in (
        ModeledStrategy("ddp", "DDP (all-reduce, every rank steps all)", None, exchange="none"),
        ModeledStrategy("zero1_sorted_greedy", "ZeRO-1 on DDP, sorted_greedy, all-gather", SortedGreedy),
        ModeledStrategy("zero1_flat", "ZeRO-1 on DDP, flat, all-gather", Flat),
        ModeledStrategy(
            "zero1_flat_rs",
            "ZeRO-1 on DDP, flat, grad_reduce=reduce_scatter (native, DDP's buckets)",
            Flat,
            grad_reduce="reduce_scatter_native",
        ),
        ModeledStrategy(
            "zero2_engine",
            "ZeRO-2 engine, owned buffers: reduce-scatter in backward, all-gather before forward",
            Flat,
            grad_reduce="owned",
            exchange_hidden=True,
            release_grads=True,
        ),
        ModeledStrategy("zero1_muon", "ZeRO-1 Muon, owners by Newton–Schulz cost", _newton_schulz_greedy, muon=True),
    )
}


@dataclass(frozen=True)
class Phase:
    """One phase of the step: its own duration, what it adds to the step after overlap, its bus
    bytes per rank on each link class, and the collectives it issues."""

    name: str
    seconds: float
    exposed_s: float
    intra_bytes: float = 0.0
    inter_bytes: float = 0.0
    collectives: tuple[Collective, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class StepPrediction:
    """The predicted step of one strategy at ``world_size`` ranks sharded over groups of ``shard_size``."""

    strategy: str
    world_size: int
    shard_size: int
    phases: tuple[Phase, ...]
    imbalance: float
    cost_imbalance: float

    @property
    def seconds(self) -> float:
        return sum(phase.exposed_s for phase in self.phases)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)

    @property
    def intra_bytes(self) -> float:
        return sum(p.intra_bytes for p in self.phases)

    @property
    def inter_bytes(self) -> float:
        return sum(p.inter_bytes for p in self.phases)


def compute_seconds(
    specs: Sequence[ParamSpec], samples_per_rank: int, hardware: Hardware, world_size: int
) -> tuple[float, float]:
    """One rank's forward and backward seconds (see *compute* in the module docstring): ``2·F`` and
    ``4·F`` FLOPs at ``matmul_flops``, each plus one read of every parameter at
    ``memory_bandwidth``; on a host of ``cores`` with more ranks, both rates × ``cores / W``."""
    share = hardware.core_share(world_size)
    flops, bandwidth = hardware.matmul_flops * share, hardware.memory_bandwidth * share
    forward = 2 * sum(s.numel for s in specs if s.trainable) * samples_per_rank
    weights = sum(s.nbytes for s in specs)
    return forward / flops + weights / bandwidth, 2 * forward / flops + weights / bandwidth


def newton_schulz_flops(shape: Sequence[int], ns_steps: int = NS_STEPS) -> float:
    """FLOPs of Newton–Schulz on one matrix: per iteration ``A = X Xᵀ`` (2a²b), ``A·A`` (2a³), ``B·X`` (2a²b)."""
    a, b = sorted(shape)
    return ns_steps * (4 * a * a * b + 2 * a**3)


def _phase(
    name: str,
    hardware: Hardware,
    collectives: Sequence[Collective],
    hidden: float = 0.0,
    sent: Sequence[Collective] | None = None,
) -> Phase:
    """``sent``: the collectives whose bytes an average rank puts on each link, where they differ
    from the ones that set the time (the busiest rank's)."""
    total = sum(seconds(hardware, c) for c in collectives)
    split = [bytes_by_link(c) for c in (collectives if sent is None else sent)]
    return Phase(
        name,
        total,
        total - hidden,
        sum(i for i, _ in split),
        sum(o for _, o in split),
        tuple(collectives),
    )


class _Layout:
    """Where ranks sit: groups of ``S`` consecutive ranks, ``W/S`` groups, nodes of ``ranks_per_node``."""

    def __init__(self, world_size: int, shard_size: int, ranks_per_node: int):
        self.world_size, self.shard_size, self.per_node = world_size, shard_size, ranks_per_node

    @property
    def group_nodes(self) -> int:
        """The nodes one group spans (rank 0's: every group spans as many)."""
        return nodes_spanned(range(self.shard_size), self.per_node)

    def group(self, op: str, nbytes: int) -> Collective:
        """``op`` inside one group."""
        return Collective(op, nbytes, self.shard_size, self.group_nodes)

    def across(self, op: str, nbytes: int) -> Collective:
        """``op`` across groups, among the ranks that own the same shard (rank 0's peers)."""
        peers = range(0, self.world_size, self.shard_size)
        return Collective(op, nbytes, len(peers), nodes_spanned(peers, self.per_node))


def _owned(partition: Partition) -> list[int]:
    """Elements each rank owns of parameters that get a gradient."""
    owned = [0] * partition.world_size
    for shard in partition.shards:
        spec = partition.specs[shard.param]
        if spec.trainable and spec.gets_grad:
            owned[shard.rank] += shard.numel
    return owned


def _bucket_segments(specs: Sequence[ParamSpec], partition: Partition | None, world: int) -> list[list[int]]:
    """Per DDP bucket (in the order DDP reduces them), the bytes of it each rank owns."""
    trainable = [i for i, s in enumerate(specs) if s.trainable and s.gets_grad]
    buckets = DdpBuckets().assign([specs[i].nbytes for i in trainable])
    where = dict(zip(trainable, buckets))
    segments = [[0] * world for _ in range(max(buckets, default=-1) + 1)]
    if partition is None:
        for index, bucket in where.items():
            segments[bucket][0] += specs[index].nbytes
        return segments
    for shard in partition.shards:
        if shard.param in where:
            segments[where[shard.param]][shard.rank] += shard.numel * specs[shard.param].itemsize
    return segments


def _grad_phase(
    strategy: ModeledStrategy,
    hardware: Hardware,
    layout: _Layout,
    buckets: list[list[int]],
    backward_s: float,
    crowded: bool,
) -> Phase:
    world, shard = layout.world_size, layout.shard_size
    collectives: list[Collective] = []
    sent: list[Collective] = []  # what an average rank sends, where the busiest rank sets the time
    last: list[Collective] = []
    for segments in buckets:
        bucket = sum(segments)
        if strategy.grad_reduce == "all_reduce":
            issued = [Collective("all_reduce", bucket, world, nodes_spanned(range(world), layout.per_node))]
            average = issued
        else:
            if strategy.grad_reduce == "owned":
                issued = [layout.group("reduce_scatter", bucket)]
                average = list(issued)
            elif strategy.grad_reduce == "reduce_scatter_native":
                issued = [layout.group("reduce_scatter", max(segments) * shard)]
                average = list(issued)
            else:  # point to point, every message in flight at once: the busiest rank's sends, receives (and adds)
                if crowded and layout.group_nodes == 1:  # the cores, not a link, are the limit
                    segments = [bucket // shard] * shard  # ranks take turns: the bucket's total copies set the time
                issued = [_p2p_reduce_scatter(layout, hardware, segments)]
                average = [layout.group("send_recv", math.ceil(bucket * (shard - 1) / shard))]
            if world > shard:
                issued.append(layout.across("all_reduce", math.ceil(bucket / shard)))
                average.append(issued[-1])
        collectives += issued
        sent += average
        last = issued
    total = sum(seconds(hardware, c) for c in collectives)
    tail = sum(seconds(hardware, c) for c in last)
    hidden = min(total - tail, hardware.overlap * backward_s)
    return _phase("grad_reduce", hardware, collectives, hidden, sent)


def _p2p_reduce_scatter(layout: _Layout, hardware: Hardware, segments: Sequence[int]) -> Collective:
    """The collective that prices zero_lab's point-to-point reduce-scatter of one bucket.

    With a calibrated ``p2p_reduce_scatter`` fit (the strategy timed as DDP's hook issues it: W-1
    sends, W-1 receives into fresh buffers, the adds in rank order), that op on the *even bucket
    equivalent* of the busiest rank's load, ``busiest × S/(S-1)`` (the bucket itself when the
    segments are equal: the calibration's case). Without one (a profile measured before the op, or
    a cluster's), one ``send_recv`` of the busiest rank's bytes (:func:`p2p_busiest`)."""
    busiest = p2p_busiest(segments, hardware.duplex)
    peers = len(segments) - 1
    if P2P_REDUCE_SCATTER in hardware.collectives and peers:
        return layout.group(P2P_REDUCE_SCATTER, math.ceil(busiest * (peers + 1) / peers))
    return layout.group("send_recv", busiest)


def p2p_busiest(segments: Sequence[int], duplex: bool) -> int:
    """The bytes that set a point-to-point reduce-scatter's time: rank ``r`` owns ``segments[r]``
    bytes of the bucket, sends every peer that peer's segment (``bucket - own``) and receives
    ``(S-1) × own``, all issued at once (``batch_isend_irecv``: one α). On a ``duplex`` link a rank
    sends while it receives, so its time is the larger of the two; otherwise (Gloo on one host:
    the rank's own thread copies both ways) their sum at the rate of a swap, which moves ``S`` each
    way: ``(sent + received) / 2``. The busiest rank's figure, rounded up."""
    bucket, peers = sum(segments), len(segments) - 1
    loads = [(bucket - own, peers * own) for own in segments]
    return math.ceil(max(max(pair) if duplex else sum(pair) / 2 for pair in loads))


def _step_seconds(specs: Sequence[ParamSpec], partition: Partition | None, hardware: Hardware) -> float:
    """The slowest rank's owner step (every parameter on every rank for DDP), at ``hardware``'s per-rank rates."""
    loads = [0.0] * (partition.world_size if partition else 1)
    pieces = (
        [(0, spec, spec.numel) for spec in specs]
        if partition is None
        else [(s.rank, partition.specs[s.param], s.numel) for s in partition.shards]
    )
    for rank, spec, count in pieces:
        if not (spec.trainable and spec.gets_grad):
            continue
        if spec.elementwise:
            loads[rank] += count * spec.itemsize * ADAM_TOUCHES / hardware.memory_bandwidth
        else:
            loads[rank] += count * spec.itemsize * MUON_TOUCHES / hardware.memory_bandwidth
            loads[rank] += newton_schulz_flops(spec.shape) * count / spec.numel / hardware.matmul_flops
    return max(loads)


def _exchange_units(partition: Partition, strategy: ModeledStrategy) -> list[list[int]]:
    """Per unit of the exchange, the bytes each rank's range holds (flat buffers padded, as the run's)."""
    specs = partition.specs
    if partition.layouts:
        units = []
        for layout in partition.layouts:
            itemsize = specs[layout.params[0]].itemsize
            units.append([(stop - start) * itemsize for start, stop in layout.bounds])
        return units
    per_kind: dict[str, list[int]] = {}
    for shard in partition.shards:
        spec = specs[shard.param]
        if spec.trainable:
            per_kind.setdefault(spec.kind, [0] * partition.world_size)[shard.rank] += shard.numel * spec.itemsize
    if strategy.bucket_view or strategy.exchange == "all_gather":
        return list(per_kind.values())
    units = []
    for shard in partition.shards:
        if specs[shard.param].trainable:
            ranges = [0] * partition.world_size
            ranges[shard.rank] = shard.numel * specs[shard.param].itemsize
            units.append(ranges)
    return units


def _exchange_phase(
    strategy: ModeledStrategy, hardware: Hardware, layout: _Layout, partition: Partition | None, forward_s: float
) -> Phase:
    if partition is None or layout.shard_size == 1:
        return Phase("exchange", 0.0, 0.0)
    collectives: list[Collective] = []
    first: list[Collective] = []
    for ranges in _exchange_units(partition, strategy):
        if strategy.exchange == "all_gather":
            issued = [layout.group("all_gather", max(ranges) * len(ranges))]
        else:
            issued = [layout.group("broadcast", size) for size in ranges if size]
        collectives += issued
        first = first or issued
    if not strategy.exchange_hidden:
        return _phase("exchange", hardware, collectives)
    total = sum(seconds(hardware, c) for c in collectives)
    head = sum(seconds(hardware, c) for c in first)
    return _phase("exchange", hardware, collectives, min(total - head, hardware.overlap * forward_s))


def predict_step(
    specs: Sequence[ParamSpec],
    strategy: ModeledStrategy,
    hardware: Hardware,
    world_size: int,
    samples_per_rank: int,
    shard_size: int | None = None,
) -> StepPrediction:
    """Time and traffic of one step of ``strategy`` (see the module docstring for the phases).

    ``samples_per_rank``: tokens (or rows) each rank's forward sees per step; ``shard_size``:
    ``S``, the group the optimizer state is partitioned over (default ``W``; it must divide ``W``).
    The partitioner runs at ``S``; O(parameters + shards + W). Priced on ``hardware.on_host(W)``,
    the forward and backward on the even share of the cores (:func:`compute_seconds`).
    """
    shard = world_size if shard_size is None else min(shard_size, world_size)
    if world_size < 1 or shard < 1 or world_size % shard:
        raise ValueError(f"shard_size={shard_size} must be a positive divisor of world_size={world_size}")
    specs = list(specs)
    crowded = bool(hardware.cores) and world_size > hardware.cores
    forward_s, backward_s = compute_seconds(specs, samples_per_rank, hardware, world_size)
    hardware = hardware.on_host(world_size)
    partition = strategy.partitioner()(specs, shard) if strategy.partitioner else None
    layout = _Layout(world_size, shard, hardware.ranks_per_node)
    buckets = _bucket_segments(specs, partition, shard)
    grads = Phase("grad_reduce", 0, 0)
    if world_size > 1:
        grads = _grad_phase(strategy, hardware, layout, buckets, backward_s, crowded)
    grad_bytes = sum(s.numel * s.itemsize for s in specs if s.trainable and s.gets_grad)
    copies = grad_bytes * BUCKET_COPY_TOUCHES[strategy.grad_reduce] / hardware.memory_bandwidth
    phases = (
        Phase("forward", forward_s, forward_s),
        Phase("backward", backward_s, backward_s),
        grads,
        Phase("grad_copies", copies, copies),
        Phase("step", *(2 * [_step_seconds(specs, partition, hardware)])),
        _exchange_phase(strategy, hardware, layout, partition, forward_s),
    )
    imbalance = cost_imbalance = 1.0
    if partition is not None:
        report = partition.report()
        imbalance, cost_imbalance = report.imbalance, report.cost_imbalance
    return StepPrediction(strategy.name, world_size, shard, phases, imbalance, cost_imbalance)


def communicator_bytes(
    specs: Sequence[ParamSpec],
    strategy: ModeledStrategy,
    world_size: int,
    rank: int,
    shard_size: int | None = None,
) -> dict[str, tuple[int, int]]:
    """What zero_lab's Communicators count on ``rank`` in one step: ``{phase: (bytes, sent_bytes)}``.

    ``grad_reduce`` (zero_lab's gradient hook, or DDP's own all-reduce counted the same way: ``n``
    per bucket of ``n`` bytes, as the benchmark's profiler meter does) and ``exchange``, in the
    Communicator's conventions (:mod:`zero_lab.comm`): a broadcast of ``n`` counts ``n`` on every
    rank and sends ``n(W-1)`` from its root; an all-gather counts its output and sends
    ``⌊n(W-1)/W⌋``; point-to-point counts what is sent and received, and sends what it sends.
    At ``W=1`` only DDP's own all-reduce is issued (zero_lab's hook and exchange issue nothing):
    ``n`` per bucket, nothing sent.

    With ``shard_size=S`` < W the partition is over S ranks and ``rank`` is index ``rank % S`` of
    its shard group: the reduce-scatter and the exchange run inside that group (S ranks), and the
    reduce-scatter's owner then all-reduces its reduced segment of every DDP bucket across the
    W/S replicas (``n`` counted, ``⌊2n(R-1)/R⌋`` sent per bucket; R = W/S).
    """
    specs = list(specs)
    if world_size == 1:
        reduced = sum(s.nbytes for s in specs if s.trainable and s.gets_grad)
        return {"grad_reduce": (reduced if strategy.grad_reduce == "all_reduce" else 0, 0), "exchange": (0, 0)}
    shard = world_size if shard_size is None else shard_size
    if shard < 1 or world_size % shard:
        raise ValueError(f"shard_size={shard_size} must be a positive divisor of world_size={world_size}")
    index, replicas = rank % shard, world_size // shard
    partition = strategy.partitioner()(specs, shard) if strategy.partitioner else None
    grads = (0, 0)
    if partition is not None and strategy.grad_reduce == "reduce_scatter":
        total = sum(s.nbytes for s in specs if s.trainable and s.gets_grad)
        own = _owned(partition)[index] * specs[0].itemsize
        grads = (total - own + (shard - 1) * own, total - own)
        if replicas > 1:
            segments = [bucket[index] for bucket in _bucket_segments(specs, partition, shard)]
            across = (sum(segments), sum(2 * n * (replicas - 1) // replicas for n in segments))
            grads = (grads[0] + across[0], grads[1] + across[1])
    elif strategy.grad_reduce == "all_reduce":
        buckets = [sum(b) for b in _bucket_segments(specs, None, 1)]
        grads = (sum(buckets), sum(2 * b * (world_size - 1) // world_size for b in buckets))
    exchange = (0, 0)
    if partition is not None and shard > 1:
        payload = sent = 0
        for ranges in _exchange_units(partition, strategy):
            if strategy.exchange == "all_gather":
                padded = max(ranges) * len(ranges)
                payload, sent = payload + padded, sent + padded * (shard - 1) // shard
            else:
                payload, sent = payload + sum(ranges), sent + ranges[index] * (shard - 1)
        exchange = (payload, sent)
    return {"grad_reduce": grads, "exchange": exchange}
