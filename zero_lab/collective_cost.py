"""What a collective costs on given hardware: α-β per link class, nccl-tests' bus bandwidth (pure).

A collective over ``n`` ranks moving ``S`` bytes (nccl-tests' ``S``: the whole array — an
all-reduce's buffer, a reduce-scatter's input, an all-gather's output, a broadcast's payload)
puts ``factor(op, n) · S`` *bus bytes* through every rank's link, with the factors of
nccl-tests' ``doc/PERFORMANCE.md`` (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)::

    all_reduce 2(n-1)/n    reduce_scatter (n-1)/n    all_gather (n-1)/n    broadcast 1    send_recv 1

and zero_lab's own point-to-point reduce-scatter (``p2p_reduce_scatter``: ``S`` the bucket, cut in
``n`` equal segments; a rank sends ``(n-1)/n · S`` to its peers and receives as much, then adds
it: factor ``(n-1)/n``, ``n-1`` steps, one message to each peer).

Its time is the α-β model ``steps(op, n) · α + factor · S / B``: ``B`` the link class's bus
bandwidth (nccl-tests' busbw: what the hardware bottleneck moves per rank and second), ``α``
the latency of one algorithm step; a ring takes ``2(n-1)`` steps for an all-reduce and ``n-1``
for the others, a tree ``2⌈log2 n⌉`` for an all-reduce (NCCL's tree is for all-reduce only).

**Link classes.** Ranks ``0..G-1`` share node 0, ``G..2G-1`` node 1, ... (``G`` =
``ranks_per_node``). A collective whose ranks sit on one node runs at the ``intra`` link's α
and bandwidth. One that spans ``k`` nodes with ``m = n/k`` of its ranks on each runs ``m``
rail-aligned rings in parallel (NCCL's layout on nodes with one NIC per GPU: each ring leaves a
node through a different NIC), so its bus bandwidth is ``min(intra, m × inter)`` — the node's
NICs together, capped by the node's own links — at the ``inter`` link's α. Its bus bytes per rank
are split by the hops: each node's ``m`` rings cross to the next node once each, so on average
``k/n`` of a rank's bus bytes are inter-node. A ``send_recv`` in such a group (one message of a
point-to-point exchange with every peer) goes to an average peer: ``(n - m)/(n - 1)`` of its bytes
leave the node, through the rank's own NIC (``inter``), the rest at ``intra``.

A hardware profile may also carry per-collective fits (:attr:`Hardware.collectives`, the
calibrated Gloo profile of one host): they replace the link's α and ``B`` for that op, with
the same step counts and factors; and fits for large messages (:attr:`Hardware.large_collectives`,
from ``large_from_bytes`` of S on), which replace them there.

**Crowded hosts.** On a CPU host with ``cores``, ``W > cores`` ranks (and their Gloo threads)
take turns on the cores, and a collective's α-β scaling over ``n`` (fitted where every rank has
a core) no longer describes it. :meth:`Hardware.on_host` gives the hardware as one of ``W`` ranks
sees it: where the calibration measured a world of ``m > cores`` ranks (:class:`Crowded`), that
world's own collective fits and per-rank rates (measured with all ``m`` ranks at once), the rates
scaled by ``m / W`` beyond it; without one, the rates shared as ``cores / W``. A profile without
``cores`` (one device per rank: every cluster) is its own view at every ``W``. Usage::

    h100 = Hardware("h100", 8, intra=Link(3e-6, 450e9), inter=Link(6e-6, 50e9), matmul_flops=4e14,
                    memory_bandwidth=3.0e12)
    seconds(h100, Collective("all_reduce", 6 << 30, ranks=64, nodes=8))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

__all__ = [
    "OPS",
    "Collective",
    "Crowded",
    "Hardware",
    "Link",
    "bus_bytes",
    "bus_factor",
    "bytes_by_link",
    "latency_steps",
    "nodes_spanned",
    "seconds",
]

#: The collectives priced here; ``send_recv`` is one point-to-point message, ``p2p_reduce_scatter``
#: zero_lab's reduce-scatter made of them (``zero_lab.grad_reduce.P2PReduceScatter``).
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "p2p_reduce_scatter")
ALGORITHMS = ("ring", "tree")
#: The ops made of point-to-point messages, each to one peer (no ring: an average peer's link).
POINT_TO_POINT = ("send_recv", "p2p_reduce_scatter")


@dataclass(frozen=True)
class Link:
    """One link class: ``alpha_s`` seconds per algorithm step, ``bus_bandwidth`` bytes per second per rank."""

    alpha_s: float
    bus_bandwidth: float

    def __post_init__(self) -> None:
        if not self.alpha_s >= 0 or not self.bus_bandwidth > 0:
            raise ValueError(f"Link needs alpha_s >= 0 and bus_bandwidth > 0, got {self}")


@dataclass(frozen=True)
class Crowded:
    """A world of more ranks than cores as the calibration measured it: every op fitted on that
    world's points alone, and one rank's matmul FLOP/s and memory bytes/s with every rank computing
    at once, its share of the cores included (``zero_lab.bench.calibrate.crowded_rates``); a rate
    ``None`` was not measured. ``large_collectives``: that world's fits of messages from the
    profile's ``large_from_bytes`` on."""

    collectives: Mapping[str, Link] = field(default_factory=dict)
    matmul_flops: float | None = None
    memory_bandwidth: float | None = None
    large_collectives: Mapping[str, Link] = field(default_factory=dict)


@dataclass(frozen=True)
class Hardware:
    """A machine the step model prices: links, compute and memory rates per rank.

    ``matmul_flops``: FLOP/s one rank achieves in its forward and backward matmuls (peak ×
    the efficiency reached); ``memory_bandwidth``: bytes/s one rank moves in an elementwise
    optimizer step; ``overlap``: the share of a phase that may hide behind computation which
    really does (1: dedicated communication engines; 0: communication and computation take
    turns, as on a host whose cores run both); ``cores``: on a CPU host, the cores the ranks
    share (a rank computes ``W / cores`` times slower beyond it; ``None``: one device per rank);
    ``duplex``: a rank's point-to-point sends and receives proceed at once, each at the link's
    rate (a NIC; ``False``: they share the rank's rate, as Gloo's copies on one host do).
    ``crowded``: per world size ``m > cores``, that world as measured (:class:`Crowded`, used by
    :meth:`on_host`). ``large_collectives``: per op, the fit of messages of ``large_from_bytes``
    (nccl-tests' S) and more, where one α-β line does not hold from the smallest messages to the
    largest (Gloo's all-gather here slows past 16 MiB); smaller ones take ``collectives``.
    ``sources``: where each figure comes from (profile YAMLs carry them).
    """

    name: str
    ranks_per_node: int
    intra: Link
    inter: Link
    matmul_flops: float
    memory_bandwidth: float
    overlap: float = 1.0
    algorithm: str = "ring"
    cores: int | None = None
    duplex: bool = True
    collectives: Mapping[str, Link] = field(default_factory=dict)
    crowded: Mapping[int, Crowded] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    large_from_bytes: int | None = None
    large_collectives: Mapping[str, Link] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.ranks_per_node < 1:
            problems.append(f"ranks_per_node={self.ranks_per_node} must be >= 1")
        if not self.matmul_flops > 0 or not self.memory_bandwidth > 0:
            problems.append("matmul_flops and memory_bandwidth must be > 0")
        if not 0 <= self.overlap <= 1:
            problems.append(f"overlap={self.overlap} must be in [0, 1]")
        if self.algorithm not in ALGORITHMS:
            problems.append(f"algorithm={self.algorithm!r} must be one of {ALGORITHMS}")
        fits = {"collectives": self.collectives, "large_collectives": self.large_collectives}
        for size, world in self.crowded.items():
            if not self.cores or size <= self.cores:
                problems.append(f"crowded world {size} needs cores < {size}, got cores={self.cores}")
            fits |= {f"crowded.{size}.collectives": world.collectives}
            fits |= {f"crowded.{size}.large_collectives": world.large_collectives}
        for where, ops in fits.items():
            unknown = sorted(set(ops) - set(OPS))
            if unknown:
                problems.append(f"{where} {unknown} are not among {OPS}")
            if ops and where.endswith("large_collectives") and not self.large_from_bytes:
                problems.append(f"{where} needs large_from_bytes > 0 (the size they hold from)")
        if problems:
            raise ValueError(f"hardware {self.name!r}: " + "; ".join(problems))

    def core_share(self, world_size: int) -> float:
        """The share of a core each of ``world_size`` ranks gets: ``cores / W`` where the ranks
        outnumber the host's ``cores``, else 1 (always 1 without ``cores``: one device per rank)."""
        return min(1.0, self.cores / world_size) if self.cores else 1.0

    def on_host(self, world_size: int) -> Hardware:
        """This hardware as one of ``world_size`` ranks sees it, every rate per rank after sharing.

        ``W ≤ cores`` (or no ``cores``): itself. ``W > cores``: the measured crowded world ``m``
        nearest below ``W`` (else the smallest): its collective fits (ops it did not measure keep
        the profile's) and rates × ``m / W``; a rate it did not measure, and every rate without a
        crowded world, is the profile's × ``cores / W`` (the cores shared evenly)."""
        if not self.cores or world_size <= self.cores:
            return self
        share = self.core_share(world_size)
        matmul, memory, collectives = self.matmul_flops * share, self.memory_bandwidth * share, self.collectives
        large = self.large_collectives
        if self.crowded:
            below = [m for m in self.crowded if m <= world_size]
            m = max(below) if below else min(self.crowded)
            world = self.crowded[m]
            collectives = {**self.collectives, **world.collectives}
            # an op the world fitted over every size has no large fit of the profile's left over it
            large = {op: v for op, v in large.items() if op not in world.collectives} | dict(world.large_collectives)
            matmul = world.matmul_flops * m / world_size if world.matmul_flops else matmul
            memory = world.memory_bandwidth * m / world_size if world.memory_bandwidth else memory
        return replace(
            self,
            matmul_flops=matmul,
            memory_bandwidth=memory,
            collectives=collectives,
            large_collectives=large,
            cores=None,
            crowded={},
        )


@dataclass(frozen=True)
class Collective:
    """``op`` over ``ranks`` ranks spanning ``nodes`` nodes, moving ``nbytes`` (nccl-tests' S)."""

    op: str
    nbytes: int
    ranks: int
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"collective op {self.op!r} is not one of {OPS}")


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw correction: the bus bytes per byte of S, per rank."""
    if ranks <= 1 and op != "send_recv":
        return 0.0
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("reduce_scatter", "all_gather", "p2p_reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0


def latency_steps(op: str, ranks: int, algorithm: str = "ring") -> int:
    """Algorithm steps, each paying α once: ring ``2(n-1)`` (all-reduce) / ``n-1``; tree all-reduce ``2⌈log2 n⌉``."""
    if op == "send_recv":
        return 1
    if ranks <= 1:
        return 0
    if op == "all_reduce":
        return 2 * math.ceil(math.log2(ranks)) if algorithm == "tree" else 2 * (ranks - 1)
    return ranks - 1


def bus_bytes(collective: Collective) -> float:
    """Bytes through each rank's link: ``factor · S``."""
    return bus_factor(collective.op, collective.ranks) * collective.nbytes


def _remote_share(collective: Collective) -> float:
    """Of a point-to-point message to an average peer of the group, the share that leaves the node:
    ``(n - m) / (n - 1)`` of a rank's ``n - 1`` peers sit on other nodes (``m = n / nodes`` per node)."""
    if collective.nodes <= 1 or collective.ranks <= 1:
        return 0.0
    return (collective.ranks - collective.ranks // collective.nodes) / (collective.ranks - 1)


def _link(hardware: Hardware, collective: Collective) -> Link:
    large = hardware.large_from_bytes is not None and collective.nbytes >= hardware.large_from_bytes
    if large and collective.op in hardware.large_collectives:
        return hardware.large_collectives[collective.op]
    if collective.op in hardware.collectives:
        return hardware.collectives[collective.op]
    if collective.nodes <= 1:
        return hardware.intra
    if collective.op in POINT_TO_POINT:  # to an average peer: the remote share through this rank's NIC
        remote = _remote_share(collective)
        inverse = remote / hardware.inter.bus_bandwidth + (1 - remote) / hardware.intra.bus_bandwidth
        return Link(hardware.inter.alpha_s, 1 / inverse)
    rings = max(1, collective.ranks // collective.nodes)
    bandwidth = min(hardware.intra.bus_bandwidth, rings * hardware.inter.bus_bandwidth)
    return Link(hardware.inter.alpha_s, bandwidth)


def seconds(hardware: Hardware, collective: Collective) -> float:
    """α-β time of one collective: ``steps · α + factor · S / B`` on its link class (see the module docstring)."""
    if collective.ranks <= 1 and collective.op != "send_recv":
        return 0.0
    link = _link(hardware, collective)
    steps = latency_steps(collective.op, collective.ranks, hardware.algorithm)
    return steps * link.alpha_s + bus_bytes(collective) / link.bus_bandwidth


def bytes_by_link(collective: Collective) -> tuple[float, float]:
    """``(intra, inter)`` bus bytes per rank, on average over the ring's ranks (``nodes / ranks`` of
    the hops cross nodes when the collective spans more than one); a ``send_recv`` among ``ranks``
    goes to an average peer, ``(n - m) / (n - 1)`` of which sit on another node."""
    total = bus_bytes(collective)
    if collective.nodes <= 1:
        return total, 0.0
    if collective.op in POINT_TO_POINT:
        inter = total * _remote_share(collective)
        return total - inter, inter
    inter = total * min(1.0, collective.nodes / collective.ranks)
    return total - inter, inter


def nodes_spanned(ranks: Sequence[int], ranks_per_node: int) -> int:
    """How many nodes hold ``ranks`` (node of rank r = ``r // ranks_per_node``)."""
    return len({rank // ranks_per_node for rank in ranks})
