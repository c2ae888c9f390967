"""The one module that calls ``torch.distributed`` collectives.

Every collective of the core, the runtime and the app — the parameter exchange in
all its forms (:mod:`zero_lab.exchange`), the overlap hooks' per-bucket sends, the
Join gradient broadcast, checkpoint gathers, gradient-norm and metric reductions, the
torchrun run-dir agreement — goes through a :class:`Communicator` (the benchmark adds
only unmetered timing barriers and a memory check of its own), which labels it with ``torch.profiler.record_function``
(``zero_lab::<op>``, and ``zero_lab::<op>/wait`` for the wait of an asynchronous one),
counts its payload bytes and calls, and times it. Collectives run on the process
group's timeout (set at ``init_process_group``), so a lost peer raises instead of hanging.

Blocking collectives (``broadcast_many``, ``all_gather_into``, ``all_reduce``, ...)
return when done. Asynchronous ones (``issue_broadcasts``, ``issue_all_gather``,
``issue_all_reduce``, ``issue_reduce_scatter``, ``issue_exchange`` for point-to-point,
``issue_all_gather_p2p``: an all-gather built from it; ``issue_local``: one a host-local
transport moves, metered as its point-to-point equivalent)
return a :class:`Pending`; its ``wait()`` finishes them. The
parameter exchange's collectives (:mod:`zero_lab.collectives`) are built on these.
Accounting, in :class:`CommStats`:

* ``bytes``/``calls`` — counted at issue. ``bytes`` is the payload this rank
  contributed to or received from each collective: a broadcast of ``n`` bytes counts
  ``n`` on every rank, an all-gather into an ``n``-byte output counts ``n``;
* ``sent_bytes`` — counted at issue: the bytes this rank puts on the wire. Point-to-point
  sends count what they send, exactly; a collective counts its bus bytes per rank (the
  nccl-tests convention, of a ring over W ranks): an all-reduce of ``n`` bytes
  ``2n(W-1)/W``, a reduce-scatter of an ``n``-byte input or an all-gather into an ``n``-byte
  output ``n(W-1)/W``; a broadcast of ``n`` bytes ``n(W-1)`` on its root and nothing
  elsewhere (the W-1 copies a chain makes, all charged to the rank whose data they are; one
  broadcast per rank of equal ranges is then an all-gather's share). It is the figure that
  compares a ZeRO step with DDP's: reduce-scatter + all-gather move what one all-reduce moves;
* ``sent_by_link`` — ``sent_bytes`` split by the links they cross, on two axes: the
  group axis (``intra_group``: a Communicator's own group, the default; ``inter_group``: one
  built with ``link=INTER_GROUP``, a replica group of hierarchical sharding,
  :mod:`zero_lab.hierarchy`) and, when the launcher says which ranks share a node
  (:func:`ranks_per_node`: ``LOCAL_WORLD_SIZE`` from torchrun or zero_lab's launcher,
  ``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` from srun; ranks laid out node by node),
  the node axis (``intra_node``: the group's ranks share one node; ``inter_node``: they span
  several — the whole collective is charged there, the slow link it waits on, since which of its
  hops cross is the backend's choice; a point-to-point message, whose peer is known, is charged
  exactly, by the peer's node). Each axis sums to ``sent_bytes``;
* ``exposed_seconds`` — time the caller was blocked: issuing plus waiting;
* ``seconds`` — wall time during which at least one collective was in flight, each
  counted from its issue until its wait returned; collectives in flight together are
  counted once (several units issued at once and then waited one by one span the time
  from the first issue to the last wait, not the sum of their spans). For blocking
  collectives this equals the exposed time; for asynchronous ones the difference is work
  the caller did meanwhile, i.e. communication hidden behind computation (an upper
  bound: a collective may have finished before its wait).

On CUDA tensors a wait makes the current stream wait for the collective (NCCL's ``work.wait()``),
not the host, so the host's clock would miss the collective's time: there a span is timed with
CUDA events (:class:`Clock`), one recorded on the current stream at issue and one after the wait,
kept in the stats and read only when the totals are read (:meth:`CommStats.settle`, called by
``snapshot``, ``since``, ``plus`` and ``reset_to``: one host sync per read, none while stepping).
``exposed_seconds`` stays the host's time blocked, on either device.
"""

from __future__ import annotations

import io
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

__all__ = [
    "INTER_GROUP",
    "INTER_NODE",
    "INTRA_GROUP",
    "INTRA_NODE",
    "LINK_CLASSES",
    "SPANS_KEPT",
    "Clock",
    "CommStats",
    "Communicator",
    "Pending",
    "group_timeout",
    "new_group",
    "node_link",
    "ranks_per_node",
    "set_group_timeout",
]

#: Link classes of ``CommStats.sent_by_link``: the group axis, then the node axis.
INTRA_GROUP, INTER_GROUP, INTRA_NODE, INTER_NODE = "intra_group", "inter_group", "intra_node", "inter_node"
LINK_CLASSES = (INTRA_GROUP, INTER_GROUP, INTRA_NODE, INTER_NODE)

#: The timeout of every process group zero_lab creates (``None``: torch's default for the backend,
#: 30 minutes, not the world's): the app sets ``dist.timeout_s`` as each rank joins its world, so a
#: collective on a shard, replica or exchange group is bounded as the world's are.
_group_timeout: timedelta | None = None


def set_group_timeout(timeout: timedelta | None) -> None:
    """The timeout of the process groups zero_lab creates from now on (:func:`new_group`)."""
    global _group_timeout
    _group_timeout = timeout


def group_timeout() -> timedelta | None:
    return _group_timeout


def new_group(ranks: Sequence[int], like: Any) -> Any:
    """A process group over the global ``ranks`` on ``like``'s backend, with :func:`group_timeout`
    (every rank of the world calls it, in the same order: ``torch.distributed.new_group``'s rule)."""
    return dist.new_group(ranks=list(ranks), backend=dist.get_backend(like), timeout=_group_timeout)


# torch >= 2.13 renamed all_gather_into_tensor; keep working on older releases.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Clock:
    """Marks on one device's timeline, for timing a span without a host sync while it runs.

    On CPU a mark is ``time.perf_counter()``. On CUDA it is a ``torch.cuda.Event`` recorded on the
    device's current stream: it completes when the work queued before it does (after a collective's
    ``wait()``, when the collective has landed), and :meth:`seconds` reads it later, waiting for the
    end mark only then (once per step, or at the end, never on the hot path)."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device if device is not None else "cpu")
        self.cuda = self.device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        """Seconds from mark ``start`` to mark ``end`` (on CUDA: waits for ``end`` to complete)."""
        if isinstance(start, float):
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3


#: Device spans a :class:`CommStats` keeps unread at most before it counts those already over.
SPANS_KEPT = 256


@dataclass
class CommStats:
    """Running totals of the collectives a :class:`Communicator` issued (device spans in
    ``seconds`` once :meth:`settle` read them)."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    exposed_seconds: float = 0.0
    sent_bytes: int = 0
    sent_by_link: dict[str, int] = field(default_factory=dict)
    #: device spans (start and end marks of a :class:`Clock`) not yet in ``seconds``, in the order they ended
    _spans: deque[tuple[Any, Any]] = field(default_factory=deque, init=False, repr=False, compare=False)
    _origin: Any = field(default=None, init=False, repr=False, compare=False)  # the first span's start
    _until: float = field(default=0.0, init=False, repr=False, compare=False)  # seconds after _origin counted

    def add_span(self, start: Any, end: Any) -> None:
        """A collective in flight from device mark ``start`` to ``end``, counted at :meth:`settle`."""
        if self._origin is None:
            self._origin = start
        self._spans.append((start, end))
        if len(self._spans) >= SPANS_KEPT:  # totals nobody reads: count what is over, without waiting
            self.settle(wait=False)

    def settle(self, wait: bool = True) -> CommStats:
        """Add the device spans recorded so far to ``seconds`` — their union, as for host spans —
        reading their marks (on CUDA: waits for the last one; ``wait=False``: only the spans already
        over, asked with the marks' non-blocking ``query()``); returns ``self``."""
        while self._spans:
            start, end = self._spans[0]
            if not wait and not end.query():
                break
            self._spans.popleft()
            begin = Clock.seconds(self._origin, start) if start is not self._origin else 0.0
            finish = Clock.seconds(self._origin, end)
            self.seconds += max(0.0, finish - max(begin, self._until))
            self._until = max(self._until, finish)
        return self

    def snapshot(self) -> CommStats:
        self.settle()
        return CommStats(
            self.calls, self.bytes, self.seconds, self.exposed_seconds, self.sent_bytes, dict(self.sent_by_link)
        )

    def reset_to(self, earlier: CommStats) -> None:
        """Put these totals back to ``earlier`` (a snapshot), in place: what ran since (an ``auto``
        trial) is not counted, and communicators sharing this object see the same."""
        self.settle()
        self.calls, self.bytes, self.seconds = earlier.calls, earlier.bytes, earlier.seconds
        self.exposed_seconds, self.sent_bytes = earlier.exposed_seconds, earlier.sent_bytes
        self.sent_by_link.clear()
        self.sent_by_link.update(earlier.sent_by_link)

    def since(self, earlier: CommStats) -> CommStats:
        self.settle()
        links = {k: v - earlier.sent_by_link.get(k, 0) for k, v in self.sent_by_link.items()}
        return CommStats(
            self.calls - earlier.calls,
            self.bytes - earlier.bytes,
            self.seconds - earlier.seconds,
            self.exposed_seconds - earlier.exposed_seconds,
            self.sent_bytes - earlier.sent_bytes,
            {k: v for k, v in links.items() if v},
        )

    def plus(self, other: CommStats) -> CommStats:
        """The totals of two meters together (two communicators of one phase or one engine)."""
        self.settle(), other.settle()
        links = dict(self.sent_by_link)
        for link, nbytes in other.sent_by_link.items():
            links[link] = links.get(link, 0) + nbytes
        return CommStats(
            self.calls + other.calls,
            self.bytes + other.bytes,
            self.seconds + other.seconds,
            self.exposed_seconds + other.exposed_seconds,
            self.sent_bytes + other.sent_bytes,
            links,
        )

    def add_sent(self, nbytes: int, links: Sequence[str]) -> None:
        """Count ``nbytes`` put on the wire, once in ``sent_bytes`` and once per link axis in ``links``."""
        if not nbytes:
            return
        self.sent_bytes += nbytes
        for link in links:
            self.sent_by_link[link] = self.sent_by_link.get(link, 0) + nbytes


def ranks_per_node(environ: Mapping[str, str] | None = None) -> int | None:
    """How many consecutive ranks share a node, as the launcher says (``None``: it does not):
    ``LOCAL_WORLD_SIZE`` (torchrun, zero_lab's launcher), else ``SLURM_NTASKS_PER_NODE``, else
    ``SLURM_TASKS_PER_NODE`` when every node runs the same number (``4(x2)`` or ``4``)."""
    env = os.environ if environ is None else environ
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        if env.get(key, "").isdigit() and int(env[key]) > 0:
            return int(env[key])
    match = re.fullmatch(r"(\d+)(\(x\d+\))?", env.get("SLURM_TASKS_PER_NODE", ""))
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def node_link(global_ranks: Sequence[int], per_node: int | None) -> str | None:
    """``intra_node`` when ``global_ranks`` share one node of ``per_node`` consecutive ranks,
    ``inter_node`` when they span several, ``None`` when nodes are unknown."""
    if per_node is None:
        return None
    return INTRA_NODE if len({rank // per_node for rank in global_ranks}) <= 1 else INTER_NODE


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _ring_share(nbytes: int, world_size: int, passes: int = 1) -> int:
    """Bus bytes per rank of a ring collective over ``nbytes``: ``passes · nbytes · (W-1)/W``."""
    return passes * nbytes * (world_size - 1) // world_size


class Pending:
    """Asynchronous collectives in flight; :meth:`wait` (idempotent) finishes and meters them."""

    def __init__(
        self,
        comm: Communicator,
        op: str,
        works: list[Any],
        issued_at: float,
        clock: Clock | None = None,
        mark: Any = None,
    ):
        self.comm = comm
        self.op = op
        self._works = works
        self._issued_at = issued_at
        self._clock, self._mark = clock, mark  # CUDA tensors: their device's clock, and its mark at issue
        self.done = not works

    def wait(self) -> None:
        """Finish the collectives: on CUDA tensors the current stream waits for them (NCCL), the host
        does not; their span then ends with an event recorded after the wait."""
        if self.done:
            return
        start = time.perf_counter()
        with record_function(f"zero_lab::{self.op}/wait"):
            for work in self._works:
                work.wait()
        end = time.perf_counter()
        self.comm.stats.exposed_seconds += end - start
        if self._clock is None:
            self.comm.count_in_flight(self._issued_at, end)
        else:
            self.comm.stats.add_span(self._mark, self._clock.mark())
        self.done = True


class Communicator:
    """Collectives on one process group, metered in :attr:`stats` (``stats=``: into another
    communicator's, e.g. the overlap hooks' own group into the optimizer's). ``link``: the
    group axis its sent bytes count under (``INTER_GROUP`` for a replica group); the node
    axis is derived from its ranks and :func:`ranks_per_node` (``per_node=`` overrides)."""

    def __init__(
        self,
        process_group: Any = None,
        *,
        stats: CommStats | None = None,
        link: str = INTRA_GROUP,
        per_node: int | None = None,
    ):
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.stats = stats if stats is not None else CommStats()
        self._counted_until = 0.0  # stats.seconds covers in-flight time up to here
        self._clocks: dict[torch.device, Clock] = {}
        #: each rank of the group's global rank (looked up once: point-to-point names a peer per message)
        self._global_ranks = tuple(dist.distributed_c10d.get_global_rank(self.group, r) for r in range(self.world_size))
        if link not in (INTRA_GROUP, INTER_GROUP):
            raise ValueError(f"link={link!r}: one of {INTRA_GROUP!r}, {INTER_GROUP!r}")
        self._per_node = per_node or ranks_per_node()
        nodes = node_link(dist.get_process_group_ranks(self.group), self._per_node)
        #: the link classes this group's sent bytes count under (group axis, then node axis when known)
        self.links: tuple[str, ...] = (link,) if nodes is None else (link, nodes)

    def count_in_flight(self, start: float, end: float) -> None:
        """Add the part of ``[start, end]`` (``perf_counter`` times, ends in order) not yet in ``stats.seconds``."""
        self.stats.seconds += max(0.0, end - max(start, self._counted_until))
        self._counted_until = max(self._counted_until, end)

    def device_clock(self, tensor: torch.Tensor | None) -> Clock | None:
        """The clock a collective on ``tensor`` is timed with: ``None`` (the host's) unless it is on CUDA."""
        if tensor is None or tensor.device.type != "cuda":
            return None
        clock = self._clocks.get(tensor.device)
        if clock is None:
            clock = self._clocks[tensor.device] = Clock(tensor.device)
        return clock

    def global_rank(self, rank: int) -> int:
        return self._global_ranks[rank]

    def peer_links(self, peer: int) -> tuple[str, ...]:
        """The link classes of one message to ``peer`` (a rank of this group): the group's axis, then
        ``intra_node`` or ``inter_node`` by the peer's own node — exact, where a collective's is its group's."""
        if self._per_node is None:
            return self.links
        same = self.global_rank(self.rank) // self._per_node == self.global_rank(peer) // self._per_node
        return (self.links[0], INTRA_NODE if same else INTER_NODE)

    @contextmanager
    def _metered(self, op: str, nbytes: int, calls: int = 1, on: torch.Tensor | None = None):
        clock = self.device_clock(on)
        mark = clock.mark() if clock is not None else None
        start = time.perf_counter()
        with record_function(f"zero_lab::{op}"):
            yield
        end = time.perf_counter()
        if clock is None:
            self.count_in_flight(start, end)
        else:  # a blocking collective on CUDA tensors returns once queued: its time is the stream's
            self.stats.add_span(mark, clock.mark())
        self.stats.exposed_seconds += end - start
        self.stats.bytes += nbytes
        self.stats.calls += calls

    def _issue(
        self,
        op: str,
        nbytes: int,
        calls: int,
        launch: Callable[[], list[Any]],
        sent: int = 0,
        on: torch.Tensor | None = None,
    ) -> Pending:
        """Launch, meter and return the collectives; ``on``: one of their tensors (its device picks the clock)."""
        clock = self.device_clock(on)
        mark = clock.mark() if clock is not None else None  # the span's start, before the launch
        start = time.perf_counter()
        with record_function(f"zero_lab::{op}"):
            works = launch()
        self.stats.exposed_seconds += time.perf_counter() - start
        self.stats.bytes += nbytes
        self.stats.add_sent(sent, self.links)
        self.stats.calls += calls
        return Pending(self, op, works, start, clock, mark)

    def issue_broadcasts(self, tensors: Sequence[tuple[torch.Tensor, int]], op: str = "broadcast") -> Pending:
        """Start broadcasting each ``(tensor, src_rank)`` in place; ``wait()`` the result."""
        nbytes = sum(_nbytes(t) for t, _ in tensors)
        return self._issue(
            op,
            nbytes,
            len(tensors),
            lambda: [dist.broadcast(t, src=self.global_rank(s), group=self.group, async_op=True) for t, s in tensors],
            sum(_nbytes(t) for t, s in tensors if s == self.rank) * (self.world_size - 1),
            tensors[0][0] if tensors else None,
        )

    def issue_all_gather(self, output: torch.Tensor, local: torch.Tensor, op: str = "all_gather") -> Pending:
        """Start filling ``output`` (W equal chunks) with every rank's ``local`` chunk, in rank order."""
        return self._issue(
            op,
            _nbytes(output),
            1,
            lambda: [_all_gather_single(output, local, group=self.group, async_op=True)],
            _ring_share(_nbytes(output), self.world_size),
            output,
        )

    def issue_all_reduce(
        self, tensor: torch.Tensor, reduce_op: dist.ReduceOp = dist.ReduceOp.SUM, op: str = "all_reduce"
    ) -> Pending:
        """Start reducing ``tensor`` in place across the ranks; ``wait()`` the result."""
        return self._issue(
            op,
            _nbytes(tensor),
            1,
            lambda: [dist.all_reduce(tensor, op=reduce_op, group=self.group, async_op=True)],
            _ring_share(_nbytes(tensor), self.world_size, passes=2),
            tensor,
        )

    def issue_reduce_scatter(self, output: torch.Tensor, full: torch.Tensor, op: str = "reduce_scatter") -> Pending:
        """Start summing ``full`` (W equal chunks, rank order) across the ranks into this rank's ``output`` chunk."""
        return self._issue(
            op,
            _nbytes(full),
            1,
            lambda: [_reduce_scatter_single(output, full, group=self.group, async_op=True)],
            _ring_share(_nbytes(full), self.world_size),
            full,
        )

    def issue_exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        op: str = "p2p",
        tag: int = 0,
    ) -> Pending:
        """Start point-to-point sends ``(tensor, dst_rank)`` and receives ``(tensor, src_rank)``
        (ranks of this group), matched by ``tag``; ``wait()`` finishes them all. Counts the bytes
        sent and received, and sends (exactly) as ``sent_bytes``, each message on its peer's links."""
        nbytes = sum(_nbytes(t) for t, _ in [*sends, *recvs])
        return self._issue_p2p(op, nbytes, len(sends) + len(recvs), sends, recvs, tag)

    def _issue_p2p(
        self,
        op: str,
        nbytes: int,
        calls: int,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        tag: int,
    ) -> Pending:
        """Start ``sends`` and ``recvs`` at once (``batch_isend_irecv``), counting ``nbytes`` and ``calls``,
        and each send as sent on the links to its peer (:meth:`peer_links`)."""

        def launch() -> list[Any]:
            ops = [dist.P2POp(dist.isend, t, self.global_rank(r), self.group, tag) for t, r in sends]
            ops += [dist.P2POp(dist.irecv, t, self.global_rank(r), self.group, tag) for t, r in recvs]
            return dist.batch_isend_irecv(ops) if ops else []

        first = next((t for t, _ in [*sends, *recvs]), None)  # its device picks the clock
        pending = self._issue(op, nbytes, calls, launch, on=first)
        for tensor, peer in sends:
            self.stats.add_sent(_nbytes(tensor), self.peer_links(peer))
        return pending

    def issue_all_gather_p2p(
        self, storage: torch.Tensor, bounds: Sequence[tuple[int, int]], op: str = "all_gather_p2p", tag: int = 0
    ) -> Pending:
        """Start a point-to-point all-gather in place: this rank sends its range
        ``storage[bounds[rank]]`` to every peer (``isend``) and receives each peer's range straight
        into ``storage`` (``irecv``; ranks of this group; empty ranges move nothing). Counted as one collective: the
        bytes of the whole output (an all-gather's convention, the same on every rank), and as sent
        exactly what this rank sends, its range once per peer, each on its peer's links."""
        start, stop = bounds[self.rank]
        peers = [r for r in range(self.world_size) if r != self.rank]
        sends = [(storage[start:stop], r) for r in peers if stop > start]
        recvs = [(storage[a:b], r) for r, (a, b) in enumerate(bounds) if r != self.rank and b > a]
        total = sum(b - a for a, b in bounds) * storage.element_size()
        return self._issue_p2p(op, total, 1, sends, recvs, tag)

    def issue_local(
        self, op: str, nbytes: int, launch: Callable[[], list[Any]], sends: Sequence[tuple[int, int]]
    ) -> Pending:
        """Start a collective a host-local transport moves (:mod:`zero_lab.host_shm`: no
        ``torch.distributed`` call), labelled, timed and metered as its point-to-point equivalent:
        ``nbytes`` of payload, one call, and each ``(bytes, peer)`` of ``sends`` as sent on the links to
        that peer. ``launch`` returns the works whose ``wait()`` finishes it."""
        pending = self._issue(op, nbytes, 1, launch)
        for sent, peer in sends:
            self.stats.add_sent(sent, self.peer_links(peer))
        return pending

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Small picklable objects from every rank, in rank order, on every rank (set-up only)."""
        everyone: list[Any] = [None] * self.world_size
        with self._metered("all_gather_objects", 0):
            dist.all_gather_object(everyone, obj, group=self.group)
        return everyone

    def broadcast_many(self, tensors: Sequence[tuple[torch.Tensor, int]], op: str = "broadcast") -> None:
        """Broadcast each ``(tensor, src_rank)`` in place; all issued async, then awaited."""
        if tensors:
            self.issue_broadcasts(tensors, op).wait()

    def all_gather_into(self, output: torch.Tensor, local: torch.Tensor, op: str = "all_gather") -> None:
        """Fill ``output`` (W equal chunks) with every rank's ``local`` chunk, in rank order."""
        self.issue_all_gather(output, local, op).wait()

    def all_reduce(self, tensor: torch.Tensor, reduce_op: dist.ReduceOp = dist.ReduceOp.SUM, op: str = "all_reduce"):
        with self._metered(op, _nbytes(tensor), on=tensor):
            dist.all_reduce(tensor, op=reduce_op, group=self.group)
        self.stats.add_sent(_ring_share(_nbytes(tensor), self.world_size, passes=2), self.links)
        return tensor

    def send_object(self, obj: Any, dst: int, device: torch.device) -> None:
        """Send a picklable-by-``torch.save`` object to ``dst`` (length, then bytes)."""
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8).to(device)
        length = torch.tensor([payload.numel()], dtype=torch.long, device=device)
        with self._metered("send_object", _nbytes(payload) + 8, 2):
            dist.send(length, dst=self.global_rank(dst), group=self.group)
            dist.send(payload, dst=self.global_rank(dst), group=self.group)

    def recv_object(self, src: int, device: torch.device) -> Any:
        """Receive an object sent with :meth:`send_object`; loads with ``weights_only=True``."""
        length = torch.zeros(1, dtype=torch.long, device=device)
        with self._metered("recv_object", 8, 2):
            dist.recv(length, src=self.global_rank(src), group=self.group)
            payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
            dist.recv(payload, src=self.global_rank(src), group=self.group)
            self.stats.bytes += _nbytes(payload)
        return torch.load(io.BytesIO(payload.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)

    def gather_objects(self, obj: Any, to: int, device: torch.device) -> list[Any] | None:
        """Small objects from every rank, in rank order, on rank ``to`` (``None`` elsewhere)."""
        if self.rank != to:
            self.send_object(obj, dst=to, device=device)
            return None
        return [obj if rank == to else self.recv_object(src=rank, device=device) for rank in range(self.world_size)]

    def barrier(self) -> None:
        with self._metered("barrier", 0):
            dist.barrier(group=self.group)
