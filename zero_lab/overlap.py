"""Overlap the ZeRO step with DDP's backward: comm hooks that step each gradient bucket.

Register one of these with ``ddp.register_comm_hook(None, hook)``; the optimizer must
be built with ``overlap_with_ddp=True`` (its ``step()`` is then a no-op)::

    zero = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-3)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
    for x in data:
        ddp(x).sum().backward()   # all-reduce, step and parameter exchange happen in here

Creating the hook attaches it to the optimizer's pipeline
(:meth:`~zero_lab.pipeline.StepPipeline.attach_per_bucket`) with DDP's buckets as
:mod:`zero_lab.ddp_buckets` models them and ``shard_buckets``: the pipeline then steps
(:meth:`~zero_lab.pipeline.StepPipeline.step_bucket`) and exchanges per bucket, in this hook.
The hooks and :func:`prefetch_exchange` talk to ``zero.pipeline`` only, and nothing calls
them back. Nothing is rebuilt: the partition is the
constructor's (along ``ddp_buckets=``, as the app passes, or DDP's default caps), and a
warning names the argument when the hook's buckets differ. ``exchange_report()`` is then
``overlap_per_bucket`` (broadcasts, so ``exchange="auto"`` means broadcast and
``"all_gather"`` is refused by the optimizer's constructor).

Algorithm. For each gradient bucket, DDP calls the hook when the bucket's gradients
are ready. The hook starts the wrapped all-reduce hook; when it completes, this rank
steps the shards it owns among the bucket's parameters, with the *reduced* bucket as
gradient (proxies' ``.grad`` point into it; ``param.grad`` is never touched), and
the bucket's updated shards are broadcast from their owners.
``hook_with_zero_step`` does the steps once the last bucket is reduced;
``hook_with_zero_step_interleaved`` steps every bucket as soon as it is reduced.

What torch's version cannot do and this one does:

* **every update from iteration 1** — the partition never waits for DDP to
  finalise its buckets: each bucket is planned from ``bucket.parameters()`` when it
  arrives, so a rebuilt bucket layout (or a partition along other buckets) only changes
  how many broadcasts it takes;
* **Gloo** — the exchange runs on its *own* process group and is issued strictly in
  bucket-index order (a lock-protected in-order drain), so no two ranks ever
  interleave collectives differently; backward ends waiting for the exchange;
* **any ``torch.optim`` optimizer, several param groups** — a bucket's step is the
  ordinary local optimizer stepping with every other shard's gradient ``None``;
* ``find_unused_parameters=True`` — parameters unused on every rank are not stepped
  (their gradient stays ``None`` in plain DDP); this needs all buckets, so such
  models step after the last bucket even with the interleaved hook;
* ``no_sync()`` accumulation works because DDP calls no hook inside it.

Prefetch (Megatron's ``overlap_param_gather``): :func:`prefetch_exchange` makes
``opt.step()`` only *issue* the parameter exchange; a forward pre-hook on every module
that owns parameters waits only for the exchange units (buffers, or single shards in
the per-shard broadcast layout) holding that module's own parameters, so the
exchange of later layers runs while earlier layers compute. The pre-hooks also note
the order the forward first reaches each parameter; from the next step on, ``step()``
issues the units in that order (rank 0's, adopted by every rank through one small
broadcast, :class:`~zero_lab.exchange.FirstUse`), so the first layer's unit lands
first; modules wait in whatever order the forward calls them. Hiding needs several
units: ``Flat()`` is one buffer per param group and dtype (a warning says so),
``Flat(bucket_cap_mb=1)`` one per layer of at least 1 MiB (buffers never split a module
when the optimizer got ``named_parameters()``).
With ``overlap=true`` the hooks' per-bucket sends are likewise left in flight at the
end of backward and waited for by the next forward. Everything on the optimizer that
reads parameters or optimizer state waits first (``step``, ``state_dict``,
``consolidate_state_dict``, ``load_state_dict``, ``clip_grad_norm_``,
``add_param_group``, Join, checkpoint save); ``zero_grad`` does not, because the
exchange never touches gradients (and loops call it before the forward, so waiting
there would expose the whole exchange again). A module must own the parameters its forward
reads (tied weights are: both modules register the same parameter)::

    handle = prefetch_exchange(model, opt)   # model: the module DDP wraps, or any module
    for x in data:
        opt.zero_grad(); ddp(x).sum().backward(); opt.step()   # step returns with the exchange in flight
    handle.remove()                          # waits, then steps exchange synchronously again
"""

# No ``from __future__ import annotations`` here: DDP checks a comm hook's annotations
# by identity (``bucket: dist.GradBucket``), and string annotations fail that check.
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab.comm import Communicator, new_group
from zero_lab.ddp_buckets import ddp_bucket_map
from zero_lab.exchange import InFlight, issue_owner_broadcast
from zero_lab.hierarchy import hierarchy_of
from zero_lab.optimizer import ZeroRedundancyOptimizer
from zero_lab.pipeline import StepPipeline

__all__ = ["PrefetchHandle", "hook_with_zero_step", "hook_with_zero_step_interleaved", "prefetch_exchange"]

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future]


class _BucketPlan:
    """For one DDP bucket: what this rank steps and what every owner broadcasts."""

    def __init__(self, pipeline: StepPipeline, bucket: dist.GradBucket, index_of: dict[int, int]):
        self.index = bucket.index()
        self.params = list(bucket.parameters())
        self.global_index = [index_of[id(p)] for p in self.params]
        offsets, total = [], 0
        for param in self.params:
            offsets.append(total)
            total += param.numel()
        position = {g: k for k, g in enumerate(self.global_index)}
        # (proxy, global index, bucket offset, start, stop) for the shards this rank steps
        self.mine: list[tuple[torch.Tensor, int, int, int, int]] = []
        proxies = {(shard.index, shard.start): shard.tensor for shard in pipeline.local_shards()}
        by_owner: dict[int, list[tuple[torch.Tensor, int, int]]] = {}
        for shard in sorted(pipeline.partition.shards, key=lambda s: (s.rank, s.param)):
            if shard.param not in position:
                continue
            k = position[shard.param]
            param = self.params[k]
            by_owner.setdefault(shard.rank, []).append((param, shard.start, shard.stop))
            if shard.rank == pipeline.rank:
                self.mine.append(
                    (proxies[(shard.param, shard.start)], shard.param, offsets[k], shard.start, shard.stop)
                )
        self.by_owner = sorted(by_owner.items())


class _OverlapEngine:
    """Per-iteration bookkeeping shared by the hooks of one DDP model."""

    def __init__(self, ddp: DDP, zero: ZeroRedundancyOptimizer, interleave: bool, shard_buckets: bool):
        if not isinstance(zero, ZeroRedundancyOptimizer) or not zero.overlap_with_ddp:
            raise ValueError(
                "the overlap hooks need zero_lab.ZeroRedundancyOptimizer(..., overlap_with_ddp=True); "
                f"got {type(zero).__name__}"
                + ("" if not isinstance(zero, ZeroRedundancyOptimizer) else " with overlap_with_ddp=False")
            )
        # The optimizer's pipeline, the one object this engine talks to. No reference to ``ddp``: its
        # reducer holds this engine (via the hook), and a cycle through the C++ reducer is invisible
        # to the garbage collector (the model would leak).
        self.pipeline = pipeline = zero.pipeline
        self.find_unused = bool(ddp.find_unused_parameters)
        self.interleave = interleave and not self.find_unused
        ddp_params = [p for p in ddp.module.parameters() if p.requires_grad]
        pipeline.attach_per_bucket(ddp_bucket_map(ddp), shard_buckets)  # per-bucket step and exchange; builds nothing
        own = pipeline.comm
        # The exchange gets its own group: its broadcasts never interleave with DDP's all-reduces;
        # it is metered where the optimizer's exchange is. With shard groups (shard_size < W) DDP's
        # all-reduce gives every rank the whole averaged gradient, each group steps and exchanges its
        # replica of the state inside itself: the exchange groups are shard groups of their own, made
        # on every rank in the same order.
        if own.world_size == dist.get_world_size(ddp.process_group):
            group = new_group([own.global_rank(r) for r in range(own.world_size)], like=own.group)
        else:
            group = hierarchy_of(ddp.process_group, own.world_size, tag="overlap").shard_group
        self.comm = Communicator(group, stats=own.stats)
        self.trainable = [p.requires_grad for p in pipeline.params]
        self.index_of = {id(p): i for i, p in enumerate(pipeline.params)}
        self.plans: dict[tuple[int, tuple[int, ...]], _BucketPlan] = {}
        self.ddp_params = ddp_params
        self.locally_used: set[int] = set()  # ids of params whose gradient arrived this iteration
        if self.find_unused:
            # Tensor post-accumulate hooks run before DDP marks the parameter ready, so by
            # the last bucket every used parameter is recorded.
            for param in ddp_params:
                param.register_post_accumulate_grad_hook(lambda p: self.locally_used.add(id(p)))
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.ready: dict[int, tuple[_BucketPlan, torch.Tensor]] = {}
        self.next_index = 0
        self.launched = 0  # hooks called this iteration
        self.expected: int | None = None  # known once the last bucket's hook is called
        self.completed = 0  # all-reduces finished (Gloo may finish them out of order)
        self.futures: list[torch.futures.Future] = []
        self.inflight: list[InFlight] = []
        self.unused: set[int] = set()
        self.started = False

    # ---------------------------------------------------------------- the hook
    def hook(self, allreduce_hook: CommHook, state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        if not self.started:
            self._begin_iteration()
        plan = self._plan(bucket)
        with self.lock:
            self.launched += 1
            if bucket.is_last():
                self.expected = self.launched
        if bucket.is_last() and self.find_unused:
            self.unused = self._globally_unused()
        future = allreduce_hook(state, bucket)

        def after(done: torch.futures.Future) -> torch.Tensor:
            value = done.value()
            reduced = value[0] if isinstance(value, list) else value
            with self.lock:
                self.ready[plan.index] = (plan, reduced)
                self.completed += 1
                all_ready = self.completed == self.expected
                if self.interleave or all_ready:
                    self._drain(all_ready)
            return reduced

        chained = future.then(after)
        self.futures.append(chained)
        return chained

    def _begin_iteration(self) -> None:
        trainable = [p.requires_grad for p in self.pipeline.params]
        if trainable != self.trainable:
            raise RuntimeError(
                "parameter trainability changed while overlap_with_ddp=True; the DDP comm hook cannot follow. "
                "Rebuild DDP, the optimizer and the hook after changing requires_grad."
            )
        self.pipeline.wait_for_exchange()  # prefetch: what the forward did not wait for (unused parameters)
        self._reset()
        self.started = True
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _plan(self, bucket: dist.GradBucket) -> _BucketPlan:
        key = (bucket.index(), tuple(id(p) for p in bucket.parameters()))
        if key not in self.plans:
            self.plans[key] = _BucketPlan(self.pipeline, bucket, self.index_of)
        return self.plans[key]

    def _globally_unused(self) -> set[int]:
        """Global indices of parameters no rank used since the last step (no_sync included).

        Called at the last bucket, before its all-reduce and before any exchange is
        issued (interleaving is off with find_unused_parameters), so this one small
        all-reduce on the exchange group is in the same place on every rank.
        """
        used = torch.tensor([float(id(p) in self.locally_used) for p in self.ddp_params])
        self.comm.all_reduce(used, reduce_op=dist.ReduceOp.MAX, op="overlap_used_map")
        return {self.index_of[id(p)] for p, flag in zip(self.ddp_params, used.tolist()) if flag == 0}

    # ---------------------------------------------------------------- step + exchange
    def _drain(self, all_ready: bool) -> None:
        """Step and start the exchange of consecutive ready buckets, in index order."""
        while self.next_index in self.ready:
            plan, reduced = self.ready.pop(self.next_index)
            self._step_and_send(plan, reduced)
            self.next_index += 1
        if all_ready and self.ready:
            for index in sorted(self.ready):  # indices may skip (e.g. DDP's first iteration)
                self._step_and_send(*self.ready.pop(index))

    def _step_and_send(self, plan: _BucketPlan, reduced: torch.Tensor) -> None:
        grads = [
            (proxy, reduced[offset + start : offset + stop].view_as(proxy).to(proxy.dtype))
            for proxy, index, offset, start, stop in plan.mine
            if index not in self.unused
        ]
        if grads:
            self.pipeline.step_bucket(grads)
        if self.comm.world_size == 1:
            return  # every shard is this rank's: nothing to send
        for owner, shards in plan.by_owner:
            live = [(p, a, b) for p, a, b in shards if self.index_of[id(p)] not in self.unused]
            if live:
                sent = issue_owner_broadcast(self.comm, owner, live)
                sent.param_indices = frozenset(self.index_of[id(p)] for p, _, _ in live)
                self.inflight.append(sent)

    def _finish(self) -> None:
        """End of backward: every bucket stepped, every broadcast landed.

        Autograd runs this before DDP's own finalisation, so it first waits for the
        buckets' hooks (whose callbacks run on Gloo's threads) to complete.
        """
        for future in self.futures:
            future.wait()
        with self.lock:
            self._drain(all_ready=True)
            inflight, self.inflight = self.inflight, []
        for sent in inflight:
            if self.pipeline.prefetching:  # prefetch: the next forward waits, per module
                self.pipeline.track_in_flight(sent.param_indices, sent)
            else:
                sent.wait()
        self.locally_used.clear()
        self.started = False


def _make_hook(allreduce_hook: CommHook, ddp: DDP, zero: ZeroRedundancyOptimizer, interleave: bool, shard: bool):
    engine = _OverlapEngine(ddp, zero, interleave, shard)

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return engine.hook(allreduce_hook, state, bucket)

    hook.engine = engine  # type: ignore[attr-defined]
    return hook


def hook_with_zero_step(
    hook: CommHook, ddp: DDP, zero: ZeroRedundancyOptimizer, shard_buckets: bool = False
) -> CommHook:
    """Wrap ``hook`` (e.g. ``allreduce_hook``): after the last bucket is reduced, step
    every bucket's shards in bucket order and exchange them (torch's signature)."""
    return _make_hook(hook, ddp, zero, interleave=False, shard=shard_buckets)


def hook_with_zero_step_interleaved(
    hook: CommHook, ddp: DDP, zero: ZeroRedundancyOptimizer, shard_buckets: bool = False
) -> CommHook:
    """Wrap ``hook``: step each bucket's shards as soon as that bucket is reduced and
    start its exchange, overlapping optimizer work with the rest of backward."""
    return _make_hook(hook, ddp, zero, interleave=True, shard=shard_buckets)


class PrefetchHandle:
    """What :func:`prefetch_exchange` installed; :meth:`remove` undoes it."""

    def __init__(self, pipeline: StepPipeline, hooks: list[Any]):
        self.pipeline = pipeline
        self.hooks = hooks

    def remove(self) -> None:
        """Wait for an exchange in flight, drop the hooks, exchange synchronously again."""
        self.pipeline.stop_prefetch()
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def prefetch_exchange(model: torch.nn.Module, zero: ZeroRedundancyOptimizer) -> PrefetchHandle:
    """Hide the parameter exchange behind the next forward (see the module docstring)."""
    if not isinstance(zero, ZeroRedundancyOptimizer):
        raise TypeError(f"prefetch_exchange needs a zero_lab.ZeroRedundancyOptimizer, got {type(zero).__name__}")
    pipeline = zero.pipeline
    index_of = {id(p): i for i, p in enumerate(pipeline.params)}
    hooks = []
    for module in model.modules():
        indices = tuple(sorted({index_of[id(p)] for p in module.parameters(recurse=False) if id(p) in index_of}))
        if indices:
            hooks.append(module.register_forward_pre_hook(_waiter(pipeline, indices)))
    pipeline.start_prefetch()
    if not pipeline.overlap_with_ddp and pipeline.comm.world_size > 1 and pipeline.exchange_units == 1:
        mib = sum(p.numel() * p.element_size() for p in pipeline.params) / 2**20
        warnings.warn(
            f"prefetch_exchange: the parameter exchange is a single buffer ({mib:.2f} MiB), so the first module "
            "waits for all of it and only the time before the forward can hide it; cut it into about one buffer "
            "per layer with Flat(bucket_cap_mb=<about one layer's MiB>) (app: partitioner=flat "
            "partitioner.bucket_cap_mb=1 bucket_view=true)",
            stacklevel=2,
        )
    return PrefetchHandle(pipeline, hooks)


def _waiter(pipeline: StepPipeline, indices: tuple[int, ...]) -> Callable[..., None]:
    # Never traced by torch.compile: the wait is bookkeeping, timing (perf_counter) and a
    # collective's completion, which Dynamo would otherwise try to trace into the graph.
    @torch.compiler.disable
    def wait(module: torch.nn.Module, args: Any) -> None:
        pipeline.note_first_use(indices)
        pipeline.wait_for_exchange(indices)

    return wait
