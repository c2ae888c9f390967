"""Host-local shared memory: the collectives of ranks on one host without the kernel's copies.

On one host Gloo is TCP over loopback: every byte is copied into the kernel and out again, with
CPU on both sides. Here each rank of a communicator instead maps one file in ``/dev/shm`` (its
*mailbox*) and every peer's: a rank writes what its peers need into its own mailbox, once, and
each peer reads it from there (what NCCL's SHM transport does between processes of one node).
Three collectives are built on it, each the point-to-point algorithm of its Gloo twin, so the
results are bitwise those of :mod:`zero_lab.grad_reduce`'s and :mod:`zero_lab.collectives`'s:

* :func:`reduce_scatter` — each rank posts every peer's segment; each rank adds the peers'
  contributions to its own segment in rank order (``((s_0 + s_1) + s_2) + ...``, exactly as
  ``P2PReduceScatter``: bitwise DDP's sum at W=2);
* :func:`all_reduce` — each rank posts its whole tensor and sums all W in rank order (every
  rank computes the same sum, bitwise);
* :func:`all_gather` — each rank posts its range; each rank copies the peers' ranges into place.

**The mailbox.** A header page (this rank's ``posted`` and ``consumed`` sequence numbers, 64
bytes apart), then a ring of ``slots`` slots of ``slot_bytes`` each. Every collective is one or
more *messages*; a message has a sequence number ``s`` (1, 2, ... in issue order, the same on
every rank: the ranks issue the same collectives in the same order, as every collective needs)
and lives in slot ``s mod slots``. A collective bigger than a slot is cut into pieces that fit,
one message each (the same cut on every rank: it depends only on sizes every rank knows).

**The protocol** (single writer per counter, so no atomics beyond aligned 8-byte stores):

1. *post* message ``s``: first consume this rank's own messages up to ``s - slots`` (step 2),
   then wait until every peer's ``consumed >= s - slots`` (the slot's previous message is read
   by all), copy the data into the slot, then store ``posted = s``;
2. *consume* message ``s`` (in order; at the collective's ``wait()``, or earlier when step 1
   needs the slot): wait until each peer read from has ``posted >= s``, read (add or copy) its
   data from the peer's slot, then store ``consumed = s``.

The ordering relies on x86-64's total store order: the data stores become visible before the
store of ``posted`` that follows them, and a reader's loads of the data are not reordered
before its load of ``posted`` (likewise ``consumed`` after the reads). Weaker memory models
(Arm, POWER) would need fences Python cannot issue, so other machines are refused at set-up.

**Why it cannot deadlock.** Every wait is for something a peer does at a point of the common
issue order no later than the waiter's own: a consume of ``s`` waits for the peers' *post* of
``s``, which they make when they issue ``s`` (the waiter issued ``s`` already); a post of ``s``
waits for the peers' *consume* of ``s - slots``, which each makes at the latest when it issues
``s`` itself (step 1), and which needs only posts of messages ``<= s - slots`` (already made, by
induction on ``s``). No wait depends on a peer reaching a later point, nor on anyone's
``wait()`` being called, so any number of collectives may be in flight (more than ``slots``
simply makes the later issues consume the earlier ones). A lock serialises a process's
threads (a comm hook issues on autograd's thread and waits on a worker).

**Waits** spin with ``os.sched_yield()``, then back off to sleeps of up to a millisecond, and
give up after the process group's timeout (:func:`zero_lab.comm.group_timeout`, else torch's
default) with one line naming the peer rank, the collective, its tag and what to do.

**Set-up and release** (collective, on the communicator's group, at its first use or at
:func:`attach`): the ranks exchange host names and machine types (refused by name unless all
are one x86-64 host), each creates its file (sparse: memory is taken as slots are first written;
a ``/dev/shm`` without room for it is refused here, in one line), every rank maps every file
(ranks that cannot open each other's, without a shared ``/dev/shm``, are refused on every rank),
and once all have, each rank unlinks its own: from then on nothing is left in ``/dev/shm`` even
if the job is killed (the mappings hold the memory until the processes end). Files of dead
processes left by a job killed during set-up are swept at the next set-up. :func:`release`
(the engine's ``close()``) and interpreter exit unmap. Memory: ``slots × slot_bytes`` per rank,
touched pages counted in the resident memory of the writer and of each reader.

Usage (the registered strategies do this: ``grad_reduce="shm_reduce_scatter"``,
``"shm_all_reduce"``, ``exchange="shm_all_gather"``)::

    pending = host_shm.reduce_scatter(comm, segments, op="grad_shm_reduce_scatter", tag=bucket)
    pending.wait()   # segments[comm.rank] now holds the sum over ranks
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import platform
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator, Pending, group_timeout

__all__ = [
    "ALIGN",
    "PREFIX",
    "SHM_DIR",
    "Mailboxes",
    "Refused",
    "all_gather",
    "all_reduce",
    "attach",
    "check_machine",
    "check_one_host",
    "leftover_files",
    "mailbox_bytes",
    "reduce_scatter",
    "release",
    "slot_bytes_for",
    "uses_host_shm",
]

SHM_DIR = "/dev/shm"
#: Every mailbox file's name starts with this (then the creator's pid, a job token and its rank).
PREFIX = "zero_lab-shm-"
ALIGN = 64  # every piece starts on a cache line
HEADER = 4096  # the counters' page: posted at byte 0, consumed at byte 64
_POSTED, _CONSUMED = 0, ALIGN // 8  # indices of the 8-byte counters
#: A mailbox made at a strategy's first use (no :func:`attach` with the sizes): 4 slots of 4 MiB.
DEFAULT_SLOTS = 4
DEFAULT_SLOT_BYTES = 4 << 20
_X86 = ("x86_64", "amd64")
_SPINS = 2000  # yields before the waits back off to sleeps


class Refused(ValueError):
    """The mailboxes cannot be set up here (other hosts, not x86-64, no room or no shared ``/dev/shm``):
    raised on every rank of the group alike, so a caller may fall back to a transport over the network."""


def _align(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def mailbox_bytes(slots: int, slot_bytes: int) -> int:
    """The size of one rank's mailbox file: the counters' page and the slots."""
    return HEADER + slots * _align(slot_bytes)


def check_one_host(hostnames: Sequence[str], what: str) -> None:
    """Refuse unless every rank of the group runs on one host (``hostnames`` by rank)."""
    for rank, name in enumerate(hostnames):
        if name != hostnames[0]:
            raise Refused(
                f"{what}: ranks 0 and {rank} of the group are on different hosts ({hostnames[0]!r}, {name!r}); "
                "shared memory joins the processes of one host: use grad_reduce='reduce_scatter' and "
                "exchange='p2p_all_gather' (or shard_size='node', whose shard groups are one host each)"
            )


def check_machine(machines: Sequence[str], what: str) -> None:
    """Refuse unless every rank runs on x86-64 (the protocol relies on its store ordering)."""
    for name in machines:
        if name.lower() not in _X86:
            raise Refused(
                f"{what}: this machine is {name}; the shared-memory protocol relies on x86-64's store ordering "
                "(see zero_lab.host_shm): use grad_reduce='reduce_scatter' and exchange='p2p_all_gather'"
            )


def _check_cpu(tensor: torch.Tensor, what: str) -> None:
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{what}: a tensor on {tensor.device}; shared memory moves host memory: on GPUs use the backend's "
            "collectives (grad_reduce='reduce_scatter_native', exchange='all_gather')"
        )


def leftover_files(pids: Sequence[int] | None = None) -> list[str]:
    """zero_lab's mailbox files now in ``/dev/shm`` (none once every set-up is over); ``pids``: only
    those the processes with these ids made."""
    try:
        names = sorted(name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX))
    except FileNotFoundError:
        return []
    if pids is None:
        return names
    mine = {str(pid) for pid in pids}
    return [name for name in names if name[len(PREFIX) :].split("-", 1)[0] in mine]


def _sweep() -> None:
    """Unlink mailbox files whose creator is dead (a job killed during set-up)."""
    for name in leftover_files():
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
        except PermissionError:
            pass  # alive, someone else's


@dataclass
class _Message:
    seq: int
    reads: Sequence[tuple[int, int, int, torch.dtype]]  # (peer, byte offset in its slot, numel, dtype)
    consume: Callable[[list[torch.Tensor]], None]  # called with the peers' views, in the order of reads
    op: str
    tag: int


class Mailboxes:
    """One communicator's mailboxes (see the module docstring); made by :func:`attach`."""

    def __init__(self, comm: Communicator, slots: int, slot_bytes: int):
        if slots < 1 or slot_bytes < _min_slot_bytes(comm.world_size):
            raise ValueError(f"host_shm: slots={slots}, slot_bytes={slot_bytes}: need >= 1 slot of >= 256·W bytes")
        self.rank, self.world_size = comm.rank, comm.world_size
        self.global_ranks = [comm.global_rank(r) for r in range(comm.world_size)]
        self.group = comm.group  # held: the key's id stays this group's
        self.slots, self.slot_bytes = slots, _align(slot_bytes)
        timeout = group_timeout() or dist.default_pg_timeout
        self.timeout_s = timeout.total_seconds()
        self.users = 0
        self._lock = threading.Lock()
        self._seq = 0  # the last message posted
        self._pending: deque[_Message] = deque()  # posted, not yet consumed, in order
        self._maps: list[mmap.mmap] = []
        self._counters: list[memoryview] = []
        self._data: list[torch.Tensor] = []
        self._open(comm)

    # ------------------------------------------------------------------ set-up
    def _open(self, comm: Communicator) -> None:
        what = "host_shm"
        setup = Communicator(comm.group)  # unmetered: the set-up is not the training's traffic
        info = setup.all_gather_objects((socket.gethostname(), platform.machine(), os.getpid(), uuid.uuid4().hex))
        check_one_host([i[0] for i in info], what)
        check_machine([i[1] for i in info], what)
        token = info[0][3][:12]
        paths = [os.path.join(SHM_DIR, f"{PREFIX}{info[r][2]}-{token}-{r}") for r in range(self.world_size)]
        size = mailbox_bytes(self.slots, self.slot_bytes)
        _sweep()
        problem = None
        try:
            free = os.statvfs(SHM_DIR)
            if free.f_bavail * free.f_frsize < size:
                raise OSError(28, f"{free.f_bavail * free.f_frsize / 2**20:.1f} MiB free")
            fd = os.open(paths[self.rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, size)  # sparse: pages are taken when first written
            finally:
                os.close(fd)
        except OSError as error:
            problem = (
                f"{what}: cannot make a {size / 2**20:.1f} MiB mailbox in {SHM_DIR} on rank "
                f"{comm.global_rank(self.rank)} ({error.strerror}); free or enlarge {SHM_DIR} (docker: --shm-size), "
                "or use grad_reduce='reduce_scatter' and exchange='p2p_all_gather'"
            )
        problems = setup.all_gather_objects(problem)  # also the barrier: every file exists after it
        try:
            if not any(problems):
                problem = self._map(paths, size, what, comm.global_rank(self.rank))
                problems = setup.all_gather_objects(problem)  # every rank mapped every file (or none goes on)
        finally:
            if os.path.exists(paths[self.rank]):
                os.unlink(paths[self.rank])
        if any(problems):
            self.close()
            raise Refused(next(p for p in problems if p))
        for mapped in self._maps:
            self._counters.append(memoryview(mapped)[:HEADER].cast("q"))
            self._data.append(torch.frombuffer(mapped, dtype=torch.uint8, offset=HEADER))

    def _map(self, paths: Sequence[str], size: int, what: str, rank: int) -> str | None:
        """Map every rank's file; the problem in one line, if one cannot be."""
        for path in paths:
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as error:
                return (
                    f"{what}: rank {rank} cannot open {path} ({error.strerror}): the ranks do not share {SHM_DIR} "
                    "(separate containers?); use grad_reduce='reduce_scatter' and exchange='p2p_all_gather'"
                )
            try:
                self._maps.append(mmap.mmap(fd, size))
            finally:
                os.close(fd)
        return None

    def close(self) -> None:
        """Unmap the mailboxes (the files are gone already); idempotent."""
        with self._lock:
            self._pending.clear()
            self._data.clear()
            for view in self._counters:
                view.release()
            self._counters.clear()
            for mapped in self._maps:
                with contextlib.suppress(BufferError):  # a view still alive somewhere: the collector unmaps it
                    mapped.close()
            self._maps.clear()

    # ------------------------------------------------------------------ messages
    def post(
        self,
        writes: Sequence[tuple[torch.Tensor, int]],
        reads: Sequence[tuple[int, int, int, torch.dtype]],
        consume: Callable[[list[torch.Tensor]], None],
        op: str,
        tag: int,
    ) -> int:
        """Post one message: each ``(tensor, byte offset)`` of ``writes`` into this rank's next slot;
        ``consume`` runs (in order) on the ``reads`` views of the peers' slots. Returns its number."""
        with self._lock:
            if not self._maps:
                raise RuntimeError(f"host_shm: {op} after the mailboxes were released (close() ran)")
            seq = self._seq + 1
            reuse = seq - self.slots
            self._consume_through(reuse)
            for peer in range(self.world_size):
                if peer != self.rank:
                    self._wait(peer, _CONSUMED, reuse, "read its previous message in this slot", op, tag)
            slot = self._slot(self.rank, seq)
            for tensor, offset in writes:
                nbytes = tensor.numel() * tensor.element_size()
                slot[offset : offset + nbytes].view(tensor.dtype).copy_(tensor.reshape(-1))
            self._counters[self.rank][_POSTED] = seq  # after the data (x86-64: stores in order)
            self._seq = seq
            self._pending.append(_Message(seq, reads, consume, op, tag))
            return seq

    def wait(self, seq: int) -> None:
        """Consume every message up to ``seq`` (its collective is then done on this rank)."""
        with self._lock:
            self._consume_through(seq)

    def _consume_through(self, seq: int) -> None:
        while self._pending and self._pending[0].seq <= seq:
            message = self._pending.popleft()
            views = []
            for peer, offset, numel, dtype in message.reads:
                self._wait(peer, _POSTED, message.seq, "post its part", message.op, message.tag)
                nbytes = numel * dtype.itemsize
                views.append(self._slot(peer, message.seq)[offset : offset + nbytes].view(dtype))
            message.consume(views)
            self._counters[self.rank][_CONSUMED] = message.seq  # after the reads

    def _slot(self, rank: int, seq: int) -> torch.Tensor:
        start = (seq % self.slots) * self.slot_bytes
        return self._data[rank][start : start + self.slot_bytes]

    def _wait(self, peer: int, counter: int, at_least: int, what: str, op: str, tag: int) -> None:
        """Until ``peer``'s counter reaches ``at_least``: spin, yield, then sleep; one-line error at the timeout."""
        counters = self._counters[peer]
        if counters[counter] >= at_least:
            return
        deadline = time.monotonic() + self.timeout_s
        spins = 0
        while counters[counter] < at_least:
            spins += 1
            if spins < _SPINS:
                os.sched_yield()
                continue
            time.sleep(min(1e-3, 1e-5 * (spins - _SPINS + 1)))
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"host_shm: rank {self.global_ranks[peer]} did not {what} within {self.timeout_s:g} s "
                    f"({op}, tag {tag}, message {at_least}); it stopped or died: read its log (if it is only slow, "
                    "raise dist.timeout_s)"
                )


# ---------------------------------------------------------------------- which mailboxes
_OPEN: dict[tuple[int, tuple[int, ...]], Mailboxes] = {}


def _key(comm: Communicator) -> tuple[int, tuple[int, ...]]:
    return id(comm.group), tuple(comm.global_rank(r) for r in range(comm.world_size))


def attach(comm: Communicator, slots: int = DEFAULT_SLOTS, slot_bytes: int = DEFAULT_SLOT_BYTES) -> Mailboxes:
    """The mailboxes of ``comm``'s group, set up now (a collective: every rank of the group calls it)
    unless they exist; one more user until :func:`release`. Sizes apply to a new set-up only."""
    boxes = _OPEN.get(_key(comm))
    if boxes is None:
        boxes = _OPEN[_key(comm)] = Mailboxes(comm, slots, slot_bytes)
    boxes.users += 1
    return boxes


def release(comm: Communicator) -> None:
    """One user less of ``comm``'s group's mailboxes; unmapped when none is left."""
    boxes = _OPEN.get(_key(comm))
    if boxes is not None:
        boxes.users -= 1
        if boxes.users <= 0:
            del _OPEN[_key(comm)]
            boxes.close()


def _mailboxes(comm: Communicator) -> Mailboxes:
    """The group's mailboxes, set up with the default sizes at a strategy's first use (kept until exit)."""
    boxes = _OPEN.get(_key(comm))
    return boxes if boxes is not None else attach(comm)


@atexit.register
def _release_all() -> None:
    while _OPEN:
        _OPEN.popitem()[1].close()


# ---------------------------------------------------------------------- the collectives
class _Done:
    """A :class:`~zero_lab.comm.Pending`'s work: consuming the collective's last message."""

    def __init__(self, boxes: Mailboxes, seq: int):
        self.boxes, self.seq = boxes, seq

    def wait(self) -> None:
        self.boxes.wait(self.seq)


def _pieces(length: int, count: int) -> list[tuple[int, int]]:
    return [(length * j // count, length * (j + 1) // count) for j in range(count)]


def _count(nbytes: int, boxes: Mailboxes) -> int:
    """Messages for a collective whose largest write is ``nbytes`` (plus one alignment gap per rank)."""
    room = boxes.slot_bytes - _gaps(boxes.world_size)
    return max(1, -(-nbytes // room))


def _gaps(world_size: int) -> int:
    """Room a slot keeps beyond a message's bytes for the alignment of its pieces once cut."""
    return world_size * (ALIGN + 8)


def _scattered(segment_bytes: Sequence[int]) -> int:
    """The largest reduce-scatter write of any rank: the peers' segments, each aligned (the same on every rank)."""
    aligned = [_align(n) for n in segment_bytes]
    return sum(aligned) - min(aligned)


def slot_bytes_for(segment_bytes: Sequence[Sequence[int]]) -> int:
    """A slot that holds, in one message each, a reduce-scatter and an all-gather of every entry of
    ``segment_bytes`` (each the bytes of every rank's segment, in rank order; the engine: a bucket's
    owned ranges): what the engine sizes its mailbox by (:mod:`zero_lab.engine.wrapper`)."""
    largest = max((max(_scattered(sizes), _align(max(sizes))) for sizes in segment_bytes if sizes), default=0)
    world_size = max((len(sizes) for sizes in segment_bytes), default=1)
    return max(largest + _gaps(world_size), _min_slot_bytes(world_size))


def _min_slot_bytes(world_size: int) -> int:
    """The smallest slot a mailbox takes: room for one aligned piece per rank beyond the gaps."""
    return 4 * ALIGN * world_size


def _sum_in_rank_order(mine: torch.Tensor, rank: int, peers: Sequence[int], views: Sequence[torch.Tensor]) -> None:
    """``mine`` (rank ``rank``'s contribution) becomes ``((s_0 + s_1) + s_2) + ...``, bitwise:
    the contributions before it summed first (then added: ``a + b == b + a`` exactly), the later ones after."""
    before = [v for p, v in zip(peers, views) if p < rank]
    if len(before) > 1:
        total = before[0] + before[1]
        for view in before[2:]:
            total += view
        mine += total
    elif before:
        mine += before[0]
    for p, view in zip(peers, views):
        if p > rank:
            mine += view


def _issue(
    comm: Communicator, op: str, nbytes: int, sends: Sequence[tuple[int, int]], post: Callable[[Mailboxes], int]
) -> Pending:
    if comm.world_size == 1:  # nothing to move
        return comm.issue_local(op, 0, lambda: [], [])
    boxes = _mailboxes(comm)
    return comm.issue_local(op, nbytes, lambda: [_Done(boxes, post(boxes))], sends)


def reduce_scatter(comm: Communicator, segments: Sequence[torch.Tensor], op: str, tag: int = 0) -> Pending:
    """Start summing every rank's ``segments[r]`` into rank r's ``segments[r]``, in place, in rank
    order (1-D contiguous tensors, the same sizes on every rank). Metered as the point-to-point
    reduce-scatter: each peer's segment counts as sent to it."""
    me, world = comm.rank, comm.world_size
    mine = segments[me]
    _check_cpu(mine, op)
    itemsize = mine.element_size()
    peers = [r for r in range(world) if r != me]
    count = _count(_scattered([s.numel() * itemsize for s in segments]), _mailboxes(comm)) if world > 1 else 1
    cuts = [_pieces(s.numel(), count) for s in segments]

    def offsets(writer: int, j: int) -> dict[int, int]:
        """Where each peer's piece ``j`` lies in ``writer``'s slot: rank order, aligned."""
        at, where = 0, {}
        for r in range(world):
            if r != writer:
                where[r] = at
                at += _align((cuts[r][j][1] - cuts[r][j][0]) * itemsize)
        return where

    def post(boxes: Mailboxes) -> int:
        seq = 0
        for j in range(count):
            a, b = cuts[me][j]
            mine_piece = mine[a:b]
            mine_at = offsets(me, j)
            writes = [(segments[r][cuts[r][j][0] : cuts[r][j][1]], mine_at[r]) for r in peers]
            reads = [(p, offsets(p, j)[me], b - a, mine.dtype) for p in peers]
            seq = boxes.post(
                writes, reads, lambda views, piece=mine_piece: _sum_in_rank_order(piece, me, peers, views), op, tag
            )
        return seq

    nbytes = sum(segments[r].numel() for r in peers) * itemsize + len(peers) * mine.numel() * itemsize
    sends = [(segments[r].numel() * itemsize, r) for r in peers]
    return _issue(comm, op, nbytes, sends, post)


def all_reduce(comm: Communicator, tensor: torch.Tensor, op: str, tag: int = 0) -> Pending:
    """Start summing ``tensor`` (1-D, contiguous) across the ranks in place, in rank order on every rank.
    Metered as an all-reduce: ``2n(W-1)/W`` bytes sent (DDP's), each peer its share."""
    me, world = comm.rank, comm.world_size
    _check_cpu(tensor, op)
    peers = [r for r in range(world) if r != me]
    itemsize = tensor.element_size()
    count = _count(tensor.numel() * itemsize, _mailboxes(comm)) if world > 1 else 1

    def post(boxes: Mailboxes) -> int:
        seq = 0
        for a, b in _pieces(tensor.numel(), count):
            piece = tensor[a:b]
            reads = [(p, 0, b - a, tensor.dtype) for p in peers]
            seq = boxes.post(
                [(piece, 0)], reads, lambda views, piece=piece: _sum_in_rank_order(piece, me, peers, views), op, tag
            )
        return seq

    nbytes = tensor.numel() * itemsize
    share = 2 * nbytes * (world - 1) // world
    sends = [(share * (i + 1) // len(peers) - share * i // len(peers), p) for i, p in enumerate(peers)]
    return _issue(comm, op, nbytes, sends, post)


def all_gather(
    comm: Communicator, storage: torch.Tensor, bounds: Sequence[tuple[int, int]], op: str, tag: int = 0
) -> Pending:
    """Start filling ``storage`` (1-D) with every rank's range ``storage[bounds[r]]``, in place. Metered as
    the point-to-point all-gather: the output's bytes, and this rank's range as sent to each peer."""
    me, world = comm.rank, comm.world_size
    _check_cpu(storage, op)
    peers = [r for r in range(world) if r != me]
    itemsize = storage.element_size()
    longest = max(b - a for a, b in bounds)
    count = _count(longest * itemsize, _mailboxes(comm)) if world > 1 else 1
    cuts = [_pieces(b - a, count) for a, b in bounds]

    def copy_in(views: list[torch.Tensor], j: int) -> None:
        for p, view in zip(peers, views):
            start = bounds[p][0]
            storage[start + cuts[p][j][0] : start + cuts[p][j][1]].copy_(view)

    def post(boxes: Mailboxes) -> int:
        seq = 0
        start = bounds[me][0]
        for j in range(count):
            a, b = cuts[me][j]
            reads = [(p, 0, cuts[p][j][1] - cuts[p][j][0], storage.dtype) for p in peers]
            seq = boxes.post([(storage[start + a : start + b], 0)], reads, lambda v, j=j: copy_in(v, j), op, tag)
        return seq

    mine = (bounds[me][1] - bounds[me][0]) * itemsize
    total = sum(b - a for a, b in bounds) * itemsize
    return _issue(comm, op, total, [(mine, p) for p in peers if mine], post)


def uses_host_shm(strategy: Any) -> bool:
    """Whether a registered strategy or collective moves its data through these mailboxes."""
    return bool(getattr(strategy, "host_shm", False))
