"""Gradients to their owners: the gradient-reduction phase, one strategy per ``grad_reduce=``.

DDP all-reduces every gradient to every rank, although under ZeRO each rank steps only
the elements it owns. :func:`reduce_gradients` installs a DDP comm hook that reduces each
gradient bucket with a registered :class:`GradReduce` strategy instead::

    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, lr=1e-3)
    handle = reduce_gradients(ddp, opt, "reduce_scatter")   # once, before the loop
    for x in data:
        opt.zero_grad(); ddp(x).sum().backward(); opt.step()
    handle.report()   # {"requested": ..., "strategy": ..., "timings_s": ...}

Algorithm, per bucket (DDP calls the hook in bucket order on every rank, as soon as a
bucket's gradients are ready, so the reduction overlaps the rest of backward):

1. :class:`BucketRoute` (built once per bucket layout) lays the bucket out *owner by
   owner*: the element runs of every shard (:mod:`zero_lab.partition`) inside the bucket,
   grouped by the rank that owns them — whole tensors for whole-parameter partitioners,
   equal ranges for ``Flat`` — so every partition is a reduce-scatter with (possibly
   unequal) segments. Runs already contiguous are sent as views, without a copy.
2. The bucket is divided by W first, as DDP's own hook does (so W=2 is bitwise DDP's sum).
3. The strategy moves it: ``all_reduce`` sums the whole bucket on every rank (DDP's
   traffic, ``2Ψ(W-1)/W`` bytes sent per rank); ``reduce_scatter`` sends each peer the
   segment it owns and receives every peer's contribution to this rank's segment
   (point-to-point ``isend``/``irecv``: ``Ψ(W-1)/W`` sent per rank; on Gloo 24.5 ms vs the
   all-reduce's 44.5 ms for 38 MiB, FIELD-NOTES); ``reduce_scatter_native`` one
   ``reduce_scatter_tensor`` of the owner-major layout, segments zero-padded to the
   longest (what wins on NCCL); ``shm_reduce_scatter`` and ``shm_all_reduce`` the point-to-point
   reduce-scatter and an all-reduce through host-local shared memory (:mod:`zero_lab.host_shm`:
   ranks of one host, never ``auto``'s; the engine's default there). ``auto`` chooses with the tuner every phase shares
   (:mod:`zero_lab.auto`), once, at :func:`reduce_gradients`: each trial reduces a scratch
   bucket the size of DDP's largest (the figure that predicts a step: every bucket is at most
   that size), capped at a third of the model's gradient bytes, and the strategies are
   preferred by the bytes they send (fewest first, registration order among equals). The
   trial runs before the first backward, so what it allocates — the scratch and a strategy's
   own receive or padding buffers, at most ``(2 + 1/W)`` scratches, so at most the model's
   gradient bytes — is freed before the first backward allocates the gradients themselves:
   choosing never raises the run's peak. The report says which strategies were within the
   trial's noise of the choice.
   With ``shard_size=S`` < W (:mod:`zero_lab.hierarchy`) the strategy runs inside this rank's
   shard group (segments by the S owners; the bucket still divided by W) and each owner's
   reduced segment is then all-reduced across its replica group, the ranks owning the same
   elements in the other groups: only Ψ/S of each rank's gradient crosses groups (metered as
   ``inter_group``, :class:`~zero_lab.comm.CommStats`).
4. Issue happens in the hook, on the autograd thread, in bucket order; the waits and the
   sums run on one worker thread per hook, which completes the future DDP waits for.
   The bucket DDP gets back holds this rank's reduced segment and **zeros elsewhere**.

What ``param.grad`` reads after backward (with any strategy but ``all_reduce``): the
reduced gradient (mean over ranks, as DDP's) for the elements this rank owns, and
**zero** for every element it does not own — never an unreduced local gradient. With
``release_grads=True`` the gradients of parameters this rank owns no element of are
released after backward (``param.grad is None``), once DDP has written them (with any
strategy, ``all_reduce`` included: it saves the memory, not the traffic), and so is the
storage of DDP's own bucket buffers (``Ψ`` bytes DDP allocates at construction and only
uses in backward: resized to 0 bytes, given back before the next backward's first
gradient reaches DDP). What a rank then holds, between backward and the next one, is its
owned gradients (:func:`owned_grad_bytes`; measured from the real storages by
:func:`held_grad_bytes`). It releases *after* backward only: during backward DDP's buckets
and every ``param.grad`` are whole, so the peak is DDP's. For ZeRO-2 at the peak use the
engine instead (:class:`zero_lab.ShardedDataParallel`; app: ``dp=zero_lab``).

Everything this rank's optimizer reads is correct: the local optimizer steps owned
shards only, :meth:`~zero_lab.optimizer.ZeroRedundancyOptimizer.clip_grad_norm_` takes
the norm of owned elements only (and scales zeros elsewhere), and the parameter exchange
then makes every replica whole. It composes with ``no_sync()`` accumulation (DDP calls no
hook inside it), ``find_unused_parameters``, bucket views, every partitioner, prefetch
and ``overlap_with_ddp`` (:func:`reduce_gradients` with ``overlap_hook=`` one of
:mod:`zero_lab.overlap`'s wrappers: it wraps :meth:`GradReduceHandle.hook`).
``Join`` is refused (a joined rank would have to shadow point-to-point sends it cannot
know); a plain optimizer steps every parameter, so it takes a strategy that does not scatter:
``all_reduce`` (DDP's own traffic, metered: the baseline the bytes per phase are compared with) or
``shm_all_reduce`` (the same through shared memory: a DDP comm hook of its own).

A new strategy is one class (``name``, ``label``, ``scatters``, ``issue``, ``sent_bytes``)
and its tests, registered with :func:`register_grad_reduce`; ``auto`` then times it too.

This module is a phase of the optimizer's :class:`~zero_lab.pipeline.StepPipeline`: it reads
the pipeline (the partition, this rank, the parameters, the group) and nothing of the optimizer
above it but ``optimizer.pipeline``; it imports neither the optimizer nor the overlap hooks.
"""

# No ``from __future__ import annotations``: DDP checks a comm hook's annotations by
# identity (``bucket: dist.GradBucket``), and string annotations fail that check.
import queue
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
import torch.distributed as dist

from zero_lab import background, host_shm
from zero_lab.auto import Decision, tune
from zero_lab.comm import INTER_GROUP, CommStats, Communicator, Pending, new_group
from zero_lab.ddp_buckets import DdpBuckets
from zero_lab.hierarchy import hierarchy_of
from zero_lab.partition import Partition, bucket_use
from zero_lab.pipeline import StepPipeline
from zero_lab.registry import Registry

__all__ = [
    "GRAD_REDUCES",
    "AllReduce",
    "BucketRoute",
    "GradReduce",
    "GradReduceHandle",
    "P2PReduceScatter",
    "ReduceScatterNative",
    "Reduced",
    "ShmAllReduce",
    "ShmReduceScatter",
    "grad_reduce_named",
    "owned_grad_bytes",
    "reduce_gradients",
    "register_grad_reduce",
    "registered_grad_reduces",
]

Bounds = Sequence[tuple[int, int]]
G = TypeVar("G", bound=type)


class Reduced:
    """A bucket's reduction in flight; :meth:`wait` returns this rank's reduced segment."""

    def __init__(self, pending: Pending, finish: Callable[[], torch.Tensor]):
        self.pending = pending
        self._finish = finish

    def wait(self) -> torch.Tensor:
        self.pending.wait()
        return self._finish()


@runtime_checkable
class GradReduce(Protocol):
    """Reduces one gradient bucket laid out owner by owner (see the module docstring).

    ``name``: the value of ``grad_reduce=``. ``label``: the Communicator op
    (``zero_lab::<label>`` in the profiler). ``scatters``: ``False`` when every rank ends
    with the whole reduced bucket (then ``issue`` gets the bucket as it is, one segment).
    Optional: ``auto_candidate = False`` keeps a registered strategy out of ``auto``'s trials (opt-in).
    """

    name: str
    label: str
    scatters: bool

    def issue(self, comm: Communicator, segments: Sequence[torch.Tensor], tag: int) -> Reduced:
        """Start reducing: ``segments[r]`` is this rank's (already ÷ W) contribution to the
        elements rank r owns; the result is the sum over ranks of ``segments[comm.rank]``
        (which a strategy may overwrite with it: the sum in place)."""
        ...

    def sent_bytes(self, numels: Sequence[int], itemsize: int, world_size: int) -> int:
        """The bytes each rank sends for one bucket of segment sizes ``numels``."""
        ...


class AllReduce:
    """DDP's traffic: one all-reduce of the whole bucket, every rank gets every sum."""

    name = "all_reduce"
    label = "grad_all_reduce"
    scatters = False

    def issue(self, comm: Communicator, segments: Sequence[torch.Tensor], tag: int) -> Reduced:
        (whole,) = segments
        return Reduced(comm.issue_all_reduce(whole, op=self.label), lambda: whole)

    def sent_bytes(self, numels: Sequence[int], itemsize: int, world_size: int) -> int:
        return 2 * sum(numels) * itemsize * (world_size - 1) // world_size


class P2PReduceScatter:
    """Point-to-point reduce-scatter: send each peer its segment, receive every peer's
    contribution to this rank's segment, add them in rank order (Gloo's fastest, FIELD-NOTES).

    The sum is taken in place, into ``segments[comm.rank]`` (a view of the bucket when this
    rank's elements are one run, so the result needs no copy back): the contributions of the
    ranks before this one are summed in rank order into the first one's receive buffer, added
    to this rank's segment (``a + b == b + a`` exactly), then the later ranks' are added in
    order — the same rank-order sum, bitwise, as ``((s_0 + s_1) + s_2) + ...``.
    """

    name = "reduce_scatter"
    label = "grad_reduce_scatter"
    scatters = True

    def issue(self, comm: Communicator, segments: Sequence[torch.Tensor], tag: int) -> Reduced:
        me = comm.rank
        mine = segments[me]
        peers = [r for r in range(comm.world_size) if r != me and mine.numel()]
        received = {r: torch.empty_like(mine) for r in peers}
        sends = [(segments[r], r) for r in range(comm.world_size) if r != me and segments[r].numel()]
        pending = comm.issue_exchange(sends, [(received[r], r) for r in peers], op=self.label, tag=tag)

        def total() -> torch.Tensor:
            before = [received[r] for r in peers if r < me]
            for part in before[1:]:
                before[0] += part
            if before:
                mine.add_(before[0])
            for r in peers:
                if r > me:
                    mine.add_(received[r])
            return mine

        return Reduced(pending, total)

    def sent_bytes(self, numels: Sequence[int], itemsize: int, world_size: int) -> int:
        # every rank sends each peer that peer's segment: all but its own, on average (W-1)/W of the bucket
        return sum(numels) * itemsize * (world_size - 1) // world_size


class ReduceScatterNative:
    """One ``reduce_scatter_tensor`` of the owner-major bucket, segments zero-padded to the longest
    in a staging buffer — none when they already are equal, consecutive runs of one buffer (the
    engine's evenly cut buckets): the bucket is then reduced as it lies."""

    name = "reduce_scatter_native"
    label = "grad_reduce_scatter_native"
    scatters = True

    def issue(self, comm: Communicator, segments: Sequence[torch.Tensor], tag: int) -> Reduced:
        longest = max(s.numel() for s in segments)
        first = segments[comm.rank]
        full = _adjacent(segments, longest)
        if full is None:
            full = torch.zeros(longest * len(segments), dtype=first.dtype, device=first.device)
            for rank, segment in enumerate(segments):
                full[rank * longest : rank * longest + segment.numel()].copy_(segment)
        out = torch.empty(longest, dtype=first.dtype, device=first.device)
        mine = first.numel()
        return Reduced(comm.issue_reduce_scatter(out, full, op=self.label), lambda: out[:mine])

    def sent_bytes(self, numels: Sequence[int], itemsize: int, world_size: int) -> int:
        return max(numels) * world_size * itemsize * (world_size - 1) // world_size


class ShmReduceScatter:
    """:class:`P2PReduceScatter` through host-local shared memory (:mod:`zero_lab.host_shm`): each rank
    writes its peers' segments into its mailbox once, each adds the peers' contributions to its own
    segment in rank order (the same sum, bitwise). Ranks of one x86-64 host, CPU tensors; never a
    candidate of ``auto``, the engine's default there (:mod:`zero_lab.engine.wrapper`); the bytes are
    metered as the point-to-point reduce-scatter's."""

    name = "shm_reduce_scatter"
    label = "grad_shm_reduce_scatter"
    scatters = True
    auto_candidate = False
    host_shm = True

    def issue(self, comm: Communicator, segments: Sequence[torch.Tensor], tag: int) -> Reduced:
        mine = segments[comm.rank]
        return Reduced(host_shm.reduce_scatter(comm, segments, op=self.label, tag=tag), lambda: mine)

    sent_bytes = P2PReduceScatter.sent_bytes  # the same messages, through the mailboxes


class ShmAllReduce:
    """The all-reduce through host-local shared memory (:mod:`zero_lab.host_shm`): each rank writes its
    whole bucket once and sums all W contributions in rank order (every rank the same sum). The control
    of :class:`ShmReduceScatter`, and usable as DDP's comm hook; by name only; metered as an all-reduce."""

    name = "shm_all_reduce"
    label = "grad_shm_all_reduce"
    scatters = False
    auto_candidate = False
    host_shm = True

    def issue(self, comm: Communicator, segments: Sequence[torch.Tensor], tag: int) -> Reduced:
        (whole,) = segments
        return Reduced(host_shm.all_reduce(comm, whole, op=self.label, tag=tag), lambda: whole)

    sent_bytes = AllReduce.sent_bytes  # metered as DDP's all-reduce


def _adjacent(segments: Sequence[torch.Tensor], length: int) -> torch.Tensor | None:
    """The one tensor ``segments`` are, when each is a contiguous run of ``length`` elements right after
    the previous one in the same storage; else ``None``."""
    first = segments[0]
    step = length * first.element_size()
    for rank, segment in enumerate(segments):
        if (
            segment.numel() != length
            or not segment.is_contiguous()
            or segment.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or segment.data_ptr() != first.data_ptr() + rank * step
        ):
            return None
    return first.as_strided((length * len(segments),), (1,))


_REGISTRY: Registry[GradReduce] = Registry(
    "grad_reduce",
    GradReduce,
    (AllReduce, P2PReduceScatter, ReduceScatterNative, ShmReduceScatter, ShmAllReduce),
    "name, label, scatters, issue() and sent_bytes()",
)
#: Built-in ``grad_reduce=`` values (``auto`` first), the app's choices.
GRAD_REDUCES: tuple[str, ...] = ("auto", *_REGISTRY.names())


def register_grad_reduce(cls: G) -> G:
    """Make ``cls()`` the strategy of ``grad_reduce=cls.name`` (and a candidate of ``"auto"``);
    returns ``cls`` (a decorator). Registering the same class again is a no-op."""
    return _REGISTRY.register(cls)


def registered_grad_reduces() -> tuple[str, ...]:
    """Every registered strategy's name, built-in ones first."""
    return _REGISTRY.names()


def grad_reduce_named(name: str) -> GradReduce:
    """The strategy registered as ``name``; a clear error listing the others if none is."""
    return _REGISTRY.named(name)


# ---------------------------------------------------------------------- bucket layout
def _merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in runs:
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


@dataclass(frozen=True)
class BucketRoute:
    """Where each rank's elements lie in a bucket: ``runs[r]``, element ranges of the flat
    bucket owned by rank r, in bucket order (adjacent ranges merged)."""

    runs: tuple[tuple[tuple[int, int], ...], ...]
    numel: int

    @classmethod
    def of(cls, partition: Partition, params: Sequence[int], numels: Sequence[int]) -> "BucketRoute":
        """The route of a bucket holding the parameters with global indices ``params`` (of
        ``numels`` elements each), in that order, as DDP's ``bucket.parameters()`` lists them."""
        position: dict[int, int] = {}
        total = 0
        for index, numel in zip(params, numels):
            position[index] = total
            total += numel
        per_rank: list[list[tuple[int, int]]] = [[] for _ in range(partition.world_size)]
        for shard in sorted(partition.shards, key=lambda s: (s.param, s.start)):
            offset = position.get(shard.param)
            if offset is not None:
                per_rank[shard.rank].append((offset + shard.start, offset + shard.stop))
        return cls(tuple(tuple(_merge(sorted(runs))) for runs in per_rank), total)

    def numels(self) -> list[int]:
        return [sum(b - a for a, b in runs) for runs in self.runs]

    def segments(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each rank's elements of ``flat`` as one 1-D tensor (a view when they are one run)."""
        out = []
        for runs in self.runs:
            if len(runs) == 1:
                out.append(flat[runs[0][0] : runs[0][1]])
            elif runs:
                out.append(torch.cat([flat[a:b] for a, b in runs]))
            else:
                out.append(flat[:0])
        return out

    def scatter_back(self, flat: torch.Tensor, rank: int, values: torch.Tensor) -> None:
        """Zero ``flat`` except rank ``rank``'s runs, which get ``values`` (in run order; no copy
        where ``values`` already is that run of ``flat``, a sum taken in place)."""
        offset, last = 0, 0
        for a, b in self.runs[rank]:
            flat[last:a].zero_()
            source = values[offset : offset + b - a]
            if source.data_ptr() != flat[a:b].data_ptr():
                flat[a:b].copy_(source)
            offset += b - a
            last = b
        flat[last:].zero_()


# ---------------------------------------------------------------------- the hook
class _Worker:
    """One daemon thread finishing reductions in the order they were issued; ended and joined
    at the latest at interpreter exit (:mod:`zero_lab.background`)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = background.start_thread(self._run, "zero_lab-grad-reduce", lambda: self.jobs.put(None))

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()
            del job  # its collectives' Work objects are freed now, not when the thread ends at exit

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)


class GradReduceHandle:
    """What :func:`reduce_gradients` installed: the comm hook, its strategy and its meter.

    ``hook`` is the DDP comm hook (``hook(state, bucket) -> Future``); :attr:`stats` the
    Communicator totals of the gradient reduction (its own process group, so its
    point-to-point messages never interleave with the optimizer's collectives). It is the
    pipeline's gradient phase (:class:`zero_lab.pipeline.GradReducePhase`): not
    ``joinable``, since a joined rank cannot shadow sends it does not know of.

    ``pipeline``: the ZeRO optimizer's step pipeline (who owns what), or ``None`` for a plain
    optimizer (``all_reduce`` only: every rank owns everything); ``params``: the parameters
    by global index (the pipeline's, or the DDP module's for a plain optimizer).
    """

    joinable = False

    @property
    def scatters(self) -> bool:
        """Whether each rank receives only the reduced gradients it owns."""
        return grad_reduce_named(self.strategy).scatters

    def __init__(
        self,
        pipeline: StepPipeline | None,
        params: Sequence[torch.Tensor],
        comm: Communicator,
        strategy: str,
        requested: str,
        release_grads: bool,
        gradient_as_bucket_view: bool = False,
        replicas: Communicator | None = None,
    ):
        self.pipeline = pipeline
        self.params = list(params)
        self.comm = comm
        #: with ``shard_size`` < W: the replica group, where each owner's reduced segment is all-reduced
        self.replicas = replicas
        #: the data-parallel world DDP averages over (the shard group times its replicas)
        self.world_size = comm.world_size * (1 if replicas is None else replicas.world_size)
        self.requested = requested
        self.strategy = strategy
        self.release_grads = release_grads
        self.gradient_as_bucket_view = gradient_as_bucket_view
        #: DDP's bucket buffers (their storages) as the hook last saw them, by bucket index
        self.ddp_buffers: dict[int, torch.UntypedStorage] = {}
        self._freed: list[tuple[torch.UntypedStorage, int]] = []  # release_grads: (storage, bytes) freed after backward
        self.decision: Decision | None = None  # auto, once decided
        self._routes: dict[tuple[int, tuple[int, ...]], BucketRoute] = {}
        self._index_of = {id(p): i for i, p in enumerate(self.params)}
        self._worker: _Worker | None = None
        self._in_backward = False
        self._futures: list[torch.futures.Future] = []
        #: seconds backward waited for the reduction after its own work was done (running total)
        self.exposed_seconds = 0.0

    @property
    def stats(self) -> CommStats:
        return self.comm.stats

    @property
    def timings_s(self) -> dict[str, float]:
        """``auto``: each candidate's median time for the model's gradients (seconds, max over ranks)."""
        return {} if self.decision is None else dict(self.decision.timings_s)

    def report(self) -> dict[str, Any]:
        """The strategy and, with ``auto``, how it was chosen (:meth:`zero_lab.auto.Decision.as_dict`)."""
        decided = self.decision or Decision(self.strategy)
        return {
            "requested": self.requested,
            "strategy": self.strategy,
            **decided.as_dict(),
            "release_grads": self.release_grads,
            "shard_size": self.comm.world_size,
            "world_size": self.world_size,
        }

    def _route(self, bucket: dist.GradBucket) -> BucketRoute:
        params = bucket.parameters()
        key = (bucket.index(), tuple(id(p) for p in params))
        route = self._routes.get(key)
        if route is None:
            indices = [self._index_of[id(p)] for p in params]
            route = BucketRoute.of(self._partition(), indices, [p.numel() for p in params])
            self._routes[key] = route
        return route

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        """DDP's comm hook: reduce ``bucket`` with the strategy; the future holds the bucket
        with this rank's reduced segment and zeros elsewhere (whole, with ``all_reduce``)."""
        flat = bucket.buffer()
        strategy = grad_reduce_named(self.strategy)
        world = self.world_size
        future: torch.futures.Future = torch.futures.Future()
        self.ddp_buffers[bucket.index()] = flat.untyped_storage()
        if not self._in_backward:
            self._in_backward = True
            self._futures = []
            # Runs when autograd's own work is done, before DDP's finalisation (queued after the last
            # bucket's hook), which waits for these futures: the wait measured there is what is exposed.
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._futures.append(future)
        if world == 1:
            future.set_result(flat)
            return future
        flat.div_(world)
        route = None if not strategy.scatters else self._route(bucket)
        segments = [flat] if route is None else route.segments(flat)
        reduced = strategy.issue(self.comm, segments, tag=bucket.index())
        rank = self.comm.rank
        replicas = self.replicas

        def finish() -> None:
            try:
                mine = reduced.wait()
                if replicas is not None and mine.numel():  # the owners of these elements in the other groups
                    replicas.all_reduce(mine, op=f"{strategy.label}_replicas")
                if route is not None:
                    route.scatter_back(flat, rank, mine)
                future.set_result(flat)
            except Exception as error:  # handed to DDP, which raises it in backward
                future.set_exception(error)

        if self._worker is None:
            self._worker = _Worker()
            weakref.finalize(self, self._worker.submit, None)  # the thread ends with the hook
        self._worker.submit(finish)
        return future

    def _end_of_backward(self) -> None:
        """Wait for this backward's reductions (timed: the exposed part); with ``release_grads``
        queue the release, which a callback queued from a callback runs after DDP has written
        ``param.grad``."""
        start = time.perf_counter()
        for future in self._futures:
            future.wait()
        self.exposed_seconds += time.perf_counter() - start
        self._futures = []
        self._in_backward = False
        if self.release_grads:
            torch.autograd.Variable._execution_engine.queue_callback(self._release_unowned)

    def _release_unowned(self) -> None:
        """``release_grads``, after DDP has written ``param.grad``: drop the gradients of parameters this
        rank owns no element of, and free the storage of DDP's full-size bucket buffers (``Ψ`` bytes:
        DDP only reads them in backward, and :meth:`_restore_buckets` gives them back their bytes
        before the next backward writes into them). What stays is this rank's owned gradients."""
        owned = _owned_params(self._partition(), self.comm.rank)
        buffers = {storage.data_ptr() for storage in self.ddp_buffers.values() if storage.nbytes()}
        for index, param in enumerate(self.params):
            if index not in owned:
                param.grad = None
            elif param.grad is not None and param.grad.untyped_storage().data_ptr() in buffers:
                param.grad = param.grad.clone()  # gradient_as_bucket_view: keep the owned gradient, not its bucket
        for storage in self.ddp_buffers.values():
            nbytes = storage.nbytes()
            if nbytes:
                storage.resize_(0)
                self._freed.append((storage, nbytes))

    def _restore_buckets(self) -> None:
        """``release_grads``: give DDP's bucket buffers their bytes back (uninitialised: DDP overwrites
        every element it reads). A post-accumulate-grad hook of every parameter, so it runs in the
        next backward before DDP copies the first gradient into a bucket (tensor hooks run before
        DDP's own, which are the gradient accumulator's post-hooks)."""
        if self._freed:
            freed, self._freed = self._freed, []
            for storage, nbytes in freed:
                storage.resize_(nbytes)

    def _partition(self) -> Partition:
        if self.pipeline is None:
            raise RuntimeError("a plain optimizer has no partition: grad_reduce='all_reduce' needs none")
        return self.pipeline.partition

    def close(self) -> None:
        """Stop the worker thread and wait for it, and release shared-memory mailboxes (the hook must not be
        called afterwards)."""
        if self._worker is not None:
            background.end(self._worker.thread)
            self._worker = None
        if self.strategy in registered_grad_reduces() and host_shm.uses_host_shm(grad_reduce_named(self.strategy)):
            host_shm.release(self.comm)  # its shared-memory mailboxes, when they were set up


def _owned_params(partition: Partition, rank: int) -> frozenset[int]:
    return frozenset(s.param for s in partition.shards_of(rank))


def owned_grad_bytes(pipeline: StepPipeline) -> int:
    """Bytes of gradients a rank holds with ``release_grads=True``: the full gradient of every
    parameter it owns an element of (what the planner prices; ``param.grad`` is whole)."""
    params = pipeline.params
    owned = _owned_params(pipeline.partition, pipeline.rank)
    return sum(params[i].numel() * params[i].element_size() for i in owned if params[i].requires_grad)


def held_grad_bytes(params: Sequence[torch.Tensor], handle: GradReduceHandle | None = None) -> int:
    """Bytes of gradient storage held now, measured from the real storages (each counted once):
    every ``param.grad``'s, plus, given the :func:`reduce_gradients` handle, DDP's bucket buffers
    (which a bucket-view gradient shares). Without a handle DDP's buckets are not seen."""
    storages = [param.grad.untyped_storage() for param in params if param.grad is not None]
    if handle is not None:
        storages.extend(handle.ddp_buffers.values())
    sizes: dict[int, int] = {}
    for storage in storages:
        if storage.nbytes():
            sizes[storage.data_ptr()] = max(sizes.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(sizes.values())


# ---------------------------------------------------------------------- install
def reduce_gradients(
    ddp: Any,
    optimizer: Any,
    grad_reduce: str = "reduce_scatter",
    release_grads: bool = False,
    overlap_hook: Callable[..., Any] | None = None,
) -> GradReduceHandle:
    """Register a comm hook on ``ddp`` that reduces every gradient bucket to its owners.

    Call once on every rank, after building ``optimizer`` (a
    :class:`~zero_lab.optimizer.ZeroRedundancyOptimizer` over ``ddp``'s parameters, whose
    ``pipeline`` this phase joins; or a plain optimizer, ``all_reduce`` or ``shm_all_reduce``) and before the
    first backward. ``grad_reduce``: a registered strategy's name or ``"auto"``; ``release_grads``:
    release the gradients of parameters this rank does not own (and DDP's bucket storage) after
    backward — the peak during backward stays DDP's (ZeRO-2 at the peak: ``ShardedDataParallel``).
    ``overlap_hook``:
    with ``overlap_with_ddp=True``, the step hook that wraps this one
    (``zero_lab.overlap.hook_with_zero_step`` or ``..._interleaved``); required there.
    """
    if grad_reduce != "auto":
        grad_reduce_named(grad_reduce)
    pipeline = getattr(optimizer, "pipeline", None)
    if not isinstance(pipeline, StepPipeline):
        if grad_reduce == "auto" or grad_reduce_named(grad_reduce).scatters or release_grads:
            raise TypeError(
                f"reduce_gradients(grad_reduce={grad_reduce!r}) needs a zero_lab.ZeroRedundancyOptimizer, got "
                f"{type(optimizer).__name__}: a plain optimizer steps every parameter, so it needs every gradient "
                "(grad_reduce='all_reduce' meters DDP's own traffic for it; 'shm_all_reduce' moves it through shared "
                "memory)"
            )
        return _install(ddp, None, optimizer, grad_reduce, False, None)
    if pipeline.overlap_with_ddp and overlap_hook is None:
        raise ValueError(
            "reduce_gradients: this optimizer steps inside DDP's hook (overlap_with_ddp=True); pass "
            "overlap_hook=zero_lab.overlap.hook_with_zero_step_interleaved (or hook_with_zero_step)"
        )
    return _install(ddp, pipeline, optimizer, grad_reduce, release_grads, overlap_hook)


def _install(
    ddp: Any,
    pipeline: StepPipeline | None,
    optimizer: Any,
    grad_reduce: str,
    release_grads: bool,
    overlap_hook: Callable[..., Any] | None,
) -> GradReduceHandle:
    if pipeline is not None:
        pipeline.require_ddp_all_reduce()  # before any group or hook exists
    comm, replicas = _reduction_comms(ddp, pipeline)
    handles: list[GradReduceHandle] = []

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return handles[0].hook(state, bucket)

    comm_hook: Callable[..., Any] = hook
    if pipeline is not None and overlap_hook is not None and pipeline.overlap_with_ddp:
        # the step hook wraps this one: it steps each bucket once this reduction lands
        comm_hook = overlap_hook(hook, ddp, optimizer, shard_buckets=bucket_use(pipeline.partitioner).shard_buckets)
    params = pipeline.params if pipeline is not None else list(ddp.module.parameters())
    handle = GradReduceHandle(
        pipeline, params, comm, grad_reduce, grad_reduce, release_grads, bool(ddp.gradient_as_bucket_view), replicas
    )
    if release_grads:
        restore = _weak_restore(handle)
        for param in ddp.module.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(restore)
    if grad_reduce == "auto":
        handle.decision = _choose(handle.comm, ddp, scatter_ok=pipeline is not None)
        handle.strategy = handle.decision.choice
    handles.append(handle)
    if pipeline is not None:
        pipeline.attach_grad_reduce(handle)  # the pipeline's gradient phase (Join refuses it)
    ddp.register_comm_hook(None, comm_hook)
    return handle


def _reduction_comms(ddp: Any, pipeline: StepPipeline | None) -> tuple[Communicator, Communicator | None]:
    """The reduction's own groups (its messages never interleave with the optimizer's): a copy of
    the pipeline's group (DDP's, for a plain optimizer), or, when the pipeline's group is one shard
    group of DDP's (``shard_size`` < W, :mod:`zero_lab.hierarchy`), shard and replica groups of its
    own over the same ranks (created on every rank in the same order)."""
    outer = pipeline.comm if pipeline is not None else Communicator(ddp.process_group)
    ranks = [outer.global_rank(r) for r in range(outer.world_size)]
    if outer.world_size == dist.get_world_size(ddp.process_group):
        return Communicator(new_group(ranks, like=outer.group)), None
    own = hierarchy_of(ddp.process_group, outer.world_size, tag="grad_reduce")
    comm = Communicator(own.shard_group)
    if [comm.global_rank(r) for r in range(comm.world_size)] != ranks:
        raise ValueError(
            f"reduce_gradients: the optimizer shards over ranks {ranks}, which are not one shard group of DDP's "
            "process group; build the optimizer over DDP's process group (its shard_size groups follow it)"
        )
    return comm, Communicator(own.replica_group, stats=comm.stats, link=INTER_GROUP)


def _weak_restore(handle: GradReduceHandle) -> Callable[[torch.Tensor], None]:
    """``handle._restore_buckets`` through a weak reference: a tensor's hooks live where the
    garbage collector cannot see them, so a strong one would keep handle and optimizer alive."""
    ref = weakref.ref(handle)

    def restore(param: torch.Tensor) -> None:
        live = ref()
        if live is not None:
            live._restore_buckets()

    return restore


def _choose(comm: Communicator, ddp: Any, scatter_ok: bool) -> Decision:
    """``auto``: the shared tuner times every registered strategy on a scratch bucket the size of
    DDP's largest (at most a third of the gradient bytes), scaled to the model's gradient bytes."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    first = params[0]
    itemsize, world = first.element_size(), comm.world_size
    sizes = [p.numel() * itemsize for p in params]
    per_bucket: dict[int, int] = {}
    for bucket, size in zip(DdpBuckets.from_ddp(ddp).assign(sizes), sizes):
        per_bucket[bucket] = per_bucket.get(bucket, 0) + size
    scratch_bytes = min(max(per_bucket.values()), sum(sizes) // 3)
    numel = max(world, scratch_bytes // itemsize // world * world)
    chunk = numel // world
    registered = [n for n in _REGISTRY.auto_names() if scatter_ok or not grad_reduce_named(n).scatters]
    sent = {n: grad_reduce_named(n).sent_bytes([chunk] * world, itemsize, world) for n in registered}
    candidates = sorted(registered, key=sent.__getitem__)  # the preference: fewest bytes sent (stable sort)
    ranks = tuple(comm.global_rank(r) for r in range(world))
    key = ("grad_reduce", ranks, dist.get_backend(comm.group), str(first.dtype), first.device.type)
    key += (tuple(candidates), numel, sum(sizes))
    held: list[torch.Tensor] = []  # the scratch, made at the first trial (none when the decision is remembered)

    def trial(name: str) -> None:
        if not held:
            held.append(torch.zeros(numel, dtype=first.dtype, device=first.device))
        scratch = held[0]
        strategy = grad_reduce_named(name)
        segments = [scratch] if not strategy.scatters else [scratch[r * chunk : (r + 1) * chunk] for r in range(world)]
        strategy.issue(comm, segments, tag=1 << 20).wait()

    before = comm.stats.snapshot()
    decision = tune(
        key, comm, candidates, trial, device=first.device, sample_bytes=numel * itemsize, label="grad_reduce_tune"
    )
    comm.stats.reset_to(before)  # the trial is not the training's traffic
    held.clear()
    scale = sum(sizes) / (numel * itemsize)  # seconds for the model's gradients, not the scratch's
    return Decision(
        decision.choice,
        {n: t * scale for n, t in decision.timings_s.items()},
        {n: t * scale for n, t in decision.noise_s.items()},
        decision.within_noise,
        decision.sample_bytes,
    )
