"""The ZeRO step as one pipeline of three phases, built once with the optimizer.

    reduce gradients  ->  step the owned shards  ->  exchange parameters

:class:`StepPipeline` is that object: what the partition decides (who owns which elements),
the local optimizer over this rank's shards (the *step* phase, with its proxies and fp32
masters), the :class:`~zero_lab.exchange.ParamExchange` (the *exchange* phase) and the
gradient-reduction phase. :class:`~zero_lab.optimizer.ZeroRedundancyOptimizer` builds it in
its constructor, from the partitioner and DDP's buckets (given, or modelled with DDP's
default caps, :mod:`zero_lab.ddp_buckets`), and never rebuilds it: a new param group extends
it in place (:meth:`StepPipeline.extend`), and a trainability change only re-lays the
exchange's buffers.

Who calls whom: ``ZeroRedundancyOptimizer.step()`` keeps torch's contract (the overlap no-op,
Join) and calls :meth:`StepPipeline.step`; the overlap hooks (:mod:`zero_lab.overlap`) call
:meth:`StepPipeline.step_bucket` per DDP bucket, and prefetch's forward pre-hooks
:meth:`StepPipeline.wait_for_exchange`. The pipeline calls neither back; it reads the
optimizer's ``param_groups`` (the same list, shared) for the hyper-parameters.

One step (:meth:`StepPipeline.step`):

1. trainability: if ``requires_grad`` changed since the last step, re-lay the exchange;
2. hyper-parameters: copy every key but the parameters from the optimizer's param groups
   into the local optimizer's (a scheduler or the user changed ``lr`` there);
3. point each proxy's ``.grad`` at its slice of ``param.grad`` (cast to fp32 for masters);
4. the local optimizer steps (timed into :attr:`StepPipeline.local_step_seconds`); shards
   whose gradient is ``None`` are skipped by every ``torch.optim`` optimizer;
5. drop the proxies' gradients, round the fp32 masters into their parameters, and copy the
   local optimizer's hyper-parameters back (optimizers that change them, e.g. a step count);
6. exchange: synchronously, or, while prefetching (:meth:`StepPipeline.start_prefetch`),
   only issued, in the order the forward first reads the parameters.

Each phase's *strategy* is a small runtime-checkable Protocol whose implementations register
by name in a :class:`~zero_lab.registry.Registry` (``exchange=``: :class:`zero_lab.collectives.Collective`;
``grad_reduce=``: :class:`zero_lab.grad_reduce.GradReduce`). Each phase's *timing* is a
choice made once, at attach time:

* gradients — by DDP's own all-reduce in backward (:class:`DdpAllReduce`, the default), or
  per DDP bucket inside DDP's comm hook by a registered strategy
  (:func:`zero_lab.grad_reduce.reduce_gradients` attaches its handle with
  :meth:`StepPipeline.attach_grad_reduce`);
* step and exchange — after backward (``step()``), behind the next forward
  (:func:`zero_lab.overlap.prefetch_exchange`: :meth:`StepPipeline.start_prefetch`), or per
  bucket inside DDP's hook (:mod:`zero_lab.overlap`, which attaches with
  :meth:`StepPipeline.attach_per_bucket`).

An attach records the phase on the pipeline; it builds nothing, so the partition, the local
optimizer and the exchange are the constructor's whatever attaches later.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch.optim import Optimizer

from zero_lab.chained import GROUP_CLASS_KEY, NOT_HYPERPARAMETERS, ChainedOptimizer, group_class
from zero_lab.comm import Communicator
from zero_lab.exchange import ExchangeReport, FirstUse, InFlight, ParamExchange
from zero_lab.partition import Partition, Partitioner, bucket_use

__all__ = [
    "EXCHANGE_TIMINGS",
    "DdpAllReduce",
    "GradReducePhase",
    "LocalShard",
    "StepPipeline",
    "params_of",
    "sync_param_groups",
]

logger = logging.getLogger(__name__)

#: When the parameter exchange runs: in ``step()``, behind the next forward, or per bucket in DDP's hook.
EXCHANGE_TIMINGS = ("after_step", "next_forward", "per_bucket")


@runtime_checkable
class GradReducePhase(Protocol):
    """How gradients reach their owners before the step.

    ``strategy``: what moves them (``"ddp_all_reduce"``, or a registered ``grad_reduce=``
    name). ``joinable``: ``True`` when a rank that joined (``torch.distributed.algorithms.Join``)
    can shadow the reduction of the ranks still training (DDP's all-reduce can; point-to-point
    sends it cannot know cannot). ``scatters``: ``True`` when a rank receives only the reduced
    gradients it owns (the others read zero).
    """

    strategy: str
    joinable: bool
    scatters: bool

    def report(self) -> dict[str, Any]:
        """What reduces the gradients and, where it chose, how."""
        ...


class DdpAllReduce:
    """The default gradient phase: DDP's own all-reduce, every rank gets every gradient."""

    strategy = "ddp_all_reduce"
    joinable = True
    scatters = False

    def report(self) -> dict[str, Any]:
        return {"requested": None, "strategy": self.strategy}


@dataclass(frozen=True)
class LocalShard:
    """A shard this rank steps: elements ``[start, stop)`` of flattened ``param`` (global
    index ``index``); ``tensor`` is what the local optimizer holds for it (``param`` itself,
    or a proxy: a slice view, a detached alias with overlap, or an fp32 master)."""

    index: int
    param: torch.Tensor
    start: int
    stop: int
    tensor: torch.Tensor


def params_of(groups: Iterable[Mapping[str, Any]]) -> list[torch.Tensor]:
    """Every parameter of ``groups``, by global index (the groups in order): the one numbering the
    optimizer, its state dicts and this pipeline share."""
    return [p for group in groups for p in group["params"]]


def sync_param_groups(src: list[dict[str, Any]], dst: list[dict[str, Any]]) -> None:
    """Copy every hyperparameter (all keys but the parameters) from ``src`` to ``dst``."""
    if len(src) != len(dst):
        raise ValueError(f"expected {len(dst)} param groups, got {len(src)}")
    for src_group, dst_group in zip(src, dst):
        for key, value in src_group.items():
            if key not in NOT_HYPERPARAMETERS:
                dst_group[key] = value


class StepPipeline:
    """The three phases of one optimizer, built together once (see the module docstring).

    Args:
        groups: the optimizer's ``param_groups`` (the same list: hyper-parameters are read
            from it before each step and written back after).
        partition: who steps which elements; ``exchange``: the parameter exchange over it.
        rank: this rank in the exchange's group.
        optimizer_class, defaults: the local optimizer's class (groups may name their own,
            ``"optimizer_class"``) and its keyword arguments.
        master_weights: step bf16/fp16 shards as fp32 masters.
        overlap_with_ddp: whole parameters get detached proxies too (the hook steps while
            autograd may write ``param.grad``); only then may :meth:`attach_per_bucket` run.
        partitioner, ddp_buckets: what the partition was built with and along (read by
            :meth:`attach_per_bucket`'s warning).

    Attributes: ``optim`` the local optimizer; ``local_index`` its parameter positions ->
    global indices; ``proxies`` ``(tensor, param, start, stop)`` for tensors standing in for
    a parameter (slices; whole parameters too with overlap; the fp32 ``masters`` among them);
    ``grad_reduce`` the gradient phase; ``exchange_timing`` one of :data:`EXCHANGE_TIMINGS`;
    ``local_step_seconds`` the running total of local steps (no communication).
    """

    def __init__(
        self,
        groups: list[dict[str, Any]],
        partition: Partition,
        exchange: ParamExchange,
        *,
        rank: int,
        optimizer_class: type[Optimizer],
        defaults: Mapping[str, Any],
        master_weights: bool = False,
        overlap_with_ddp: bool = False,
        partitioner: Partitioner | None = None,
        ddp_buckets: Mapping[int, int] | None = None,
    ):
        self.groups = groups
        self.partition = partition
        self.exchange = exchange
        self.rank = rank
        self.optimizer_class = optimizer_class
        self.master_weights = master_weights
        self.overlap_with_ddp = overlap_with_ddp
        self.partitioner = partitioner
        self.ddp_buckets = dict(ddp_buckets or {})
        self.trainable = [p.requires_grad for p in self.params]
        self.local_index: list[int] = []
        self.proxies: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
        self.masters: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
        self.grad_reduce: GradReducePhase = DdpAllReduce()
        self.exchange_timing = "after_step"
        self.local_step_seconds = 0.0
        self.prefetching = False  # start_prefetch / stop_prefetch: step() only issues the exchange
        self.first_use = FirstUse()  # note_first_use (prefetch's pre-hooks): the exchange's issue order
        self.optim = ChainedOptimizer(self._local_groups(0), optimizer_class, **defaults)
        sync_param_groups(self.optim.param_groups, self.groups)

    @property
    def params(self) -> list[torch.Tensor]:
        """Every parameter, by global index (param groups in order)."""
        return params_of(self.groups)

    @property
    def comm(self) -> Communicator:
        """The metered collectives the exchange (and the hooks that take it over) use."""
        return self.exchange.comm

    # ------------------------------------------------------------------ build (once, extended in place)
    def _local_groups(self, first_group: int) -> list[dict[str, Any]]:
        """Local groups for global groups ``first_group..``, holding this rank's shard tensors.

        Appends to :attr:`local_index` (in the order the local optimizer numbers its
        parameters), :attr:`proxies` (slices always; whole parameters too with overlap, where
        the step must not touch ``param.grad`` while autograd may be writing it) and
        :attr:`masters` (the fp32 proxies to write back).
        """
        params = self.params
        local = [
            {k: v for k, v in g.items() if k not in NOT_HYPERPARAMETERS}
            | {"params": [], GROUP_CLASS_KEY: group_class(g, self.optimizer_class)}
            for g in self.groups[first_group:]
        ]
        members: list[list[int]] = [[] for _ in local]
        for shard in self.partition.shards_of(self.rank):
            group = self.partition.specs[shard.param].group
            if group < first_group:
                continue
            param = params[shard.param]
            whole = shard.start == 0 and shard.stop == param.numel()
            master = self.master_weights and param.dtype in (torch.bfloat16, torch.float16)
            if whole and not self.overlap_with_ddp and not master:
                tensor = param
            else:
                tensor = param.detach() if whole else param.data.view(-1)[shard.start : shard.stop]
                if master:
                    tensor = tensor.float().clone()
                    self.masters.append((tensor, param, shard.start, shard.stop))
                self.proxies.append((tensor, param, shard.start, shard.stop))
            local[group - first_group]["params"].append(tensor)
            members[group - first_group].append(shard.param)
        for indices in members:
            self.local_index.extend(indices)
        return local

    def extend(self, partition: Partition) -> None:
        """Take in the param group just appended to :attr:`groups`, partitioned by ``partition``
        (the old shards must stay where they are: only the new group is laid out)."""
        self.exchange.wait()
        before = self.partition
        kept = tuple(s for s in partition.shards if s.param < len(before.specs))
        if sorted(kept, key=lambda s: (s.param, s.start)) != sorted(before.shards, key=lambda s: (s.param, s.start)):
            raise RuntimeError(
                f"partitioner {self.partitioner!r} moved existing parameters when a group was added; "
                "zero_lab needs partitioners that are stable under appended groups"
            )
        self.partition = partition
        self.trainable = [p.requires_grad for p in self.params]
        self.exchange.update(self.params, partition)
        (new_group,) = self._local_groups(len(self.groups) - 1)
        self.optim.add_param_group(new_group)
        sync_param_groups(self.optim.param_groups, self.groups)

    def local_shards(self) -> list[LocalShard]:
        """The shards this rank steps, with the tensor the local optimizer holds for each."""
        params = self.params
        proxies = {(id(param), start): proxy for proxy, param, start, _ in self.proxies}
        return [
            LocalShard(
                s.param, params[s.param], s.start, s.stop, proxies.get((id(params[s.param]), s.start), params[s.param])
            )
            for s in self.partition.shards_of(self.rank)
        ]

    # ------------------------------------------------------------------ attach (once)
    def attach_grad_reduce(self, phase: GradReducePhase) -> None:
        """Make ``phase`` the gradient reduction (once: a second attach is refused, since
        two comm hooks on one DDP cannot both reduce)."""
        if not isinstance(phase, GradReducePhase):
            raise TypeError(f"{type(phase).__name__} is not a GradReducePhase (strategy, joinable, scatters, report())")
        self.require_ddp_all_reduce()
        self.grad_reduce = phase

    def require_ddp_all_reduce(self) -> None:
        """Raise unless the gradient phase is still DDP's own (what an attach checks first)."""
        if not isinstance(self.grad_reduce, DdpAllReduce):
            raise RuntimeError(
                f"this optimizer's gradients are already reduced by {self.grad_reduce.strategy!r}; "
                "call reduce_gradients once per DDP model and optimizer"
            )

    def attach_per_bucket(self, ddp_buckets: Mapping[int, int], shard_buckets: bool = False) -> None:
        """Step and exchange run per DDP bucket inside DDP's hook (:mod:`zero_lab.overlap`
        calls this, on every rank, when its hook is created).

        Nothing is rebuilt: the hook plans each bucket from the parameters it holds, so a
        partition along other buckets than ``ddp_buckets`` (``{id(param): bucket}``) or another
        ``shard_buckets`` is as correct, only less aligned; a warning then names the
        constructor arguments that build it aligned.
        """
        if not self.overlap_with_ddp:
            raise ValueError("attach_per_bucket: this optimizer steps itself; build it with overlap_with_ddp=True")
        self.exchange_timing = "per_bucket"
        use = bucket_use(self.partitioner)
        if not use.needs_ddp_buckets:
            return  # the partition does not follow DDP's buckets
        other_split = use.shard_buckets != shard_buckets
        if dict(ddp_buckets) == self.ddp_buckets and not other_split:
            return  # built along these
        wanted = "ddp_buckets=zero_lab.ddp_buckets.ddp_bucket_map(ddp)"
        if other_split:
            aligned = copy.copy(self.partitioner)  # the optimizer's own stays as built
            aligned.shard_buckets = shard_buckets  # type: ignore[attr-defined]
            wanted += f" and partitioner={aligned!r}"
        logger.warning(
            "zero_lab: the overlap hook brings DDP's buckets%s, but this optimizer's partition was built at "
            "construction along other ones; it is kept (every bucket is still stepped correctly, only less aligned "
            "with DDP's). To build it along DDP's buckets, pass %s to ZeroRedundancyOptimizer",
            f" and shard_buckets={shard_buckets}" if other_split else "",
            wanted,
        )

    # ------------------------------------------------------------------ step phase
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:
        """One step: the local step (:meth:`local_step`), then the exchange (:meth:`exchange_params`)."""
        loss = self.local_step(closure, **kwargs)
        self.exchange_params()
        return loss

    def local_step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:
        """Step this rank's shards only (no communication): steps 1-5 of the module docstring."""
        self.refresh_trainability()
        sync_param_groups(self.groups, self.optim.param_groups)
        self.point_proxy_grads()
        started = time.perf_counter()
        try:
            if closure is None:
                loss = self.optim.step(**kwargs)
            elif not callable(closure):  # not zero_lab's to call: the local class gets it as it came, as in torch
                loss = self.optim.step(closure=closure, **kwargs)
            else:

                def closure_then_point() -> float:
                    result = closure()
                    self.point_proxy_grads()
                    return result

                loss = self.optim.step(closure=closure_then_point, **kwargs)
        finally:
            self.local_step_seconds += time.perf_counter() - started
            self.release_proxy_grads()
        sync_param_groups(self.optim.param_groups, self.groups)
        return loss

    def step_bucket(self, proxy_grads: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Step only the given local tensors (:attr:`LocalShard.tensor`), each with the given
        gradient (the overlap hooks, per DDP bucket). No exchange: the hook broadcasts.

        Every other proxy has ``grad=None``, which every ``torch.optim`` optimizer skips.
        """
        sync_param_groups(self.groups, self.optim.param_groups)
        for proxy, grad in proxy_grads:
            proxy.grad = grad
        started = time.perf_counter()
        try:
            self.optim.step()
        finally:
            self.local_step_seconds += time.perf_counter() - started
            for proxy, _ in proxy_grads:
                proxy.grad = None
            self.write_back_masters(only={id(proxy) for proxy, _ in proxy_grads})
        sync_param_groups(self.optim.param_groups, self.groups)

    def refresh_trainability(self) -> None:
        """Re-lay the exchange's buffers if a parameter's ``requires_grad`` changed."""
        trainable = [p.requires_grad for p in self.params]
        if trainable != self.trainable:
            logger.info("zero_lab: trainable parameters changed; re-laying the parameter exchange")
            self.trainable = trainable
            self.exchange.rebuild()

    def point_proxy_grads(self) -> None:
        """Point each proxy's ``.grad`` at its slice of ``param.grad`` (cast to the proxy's dtype)."""
        for proxy, param, start, stop in self.proxies:
            grad = None if param.grad is None else param.grad.reshape(-1)[start:stop].view_as(proxy)
            proxy.grad = grad if grad is None else grad.to(proxy.dtype)

    def release_proxy_grads(self) -> None:
        """Drop the proxies' gradients and round the fp32 masters into their parameters."""
        for proxy, *_ in self.proxies:
            proxy.grad = None
        self.write_back_masters()

    def write_back_masters(self, only: set[int] | None = None) -> None:
        """Round the fp32 masters (all, or those whose ``id`` is in ``only``) into their parameters."""
        for master, param, start, stop in self.masters:
            if only is None or id(master) in only:
                param.data.reshape(-1)[start:stop].copy_(master.reshape(-1))

    def master_bytes(self) -> int:
        return sum(master.numel() * master.element_size() for master, *_ in self.masters)

    # ------------------------------------------------------------------ exchange phase
    def exchange_params(self) -> None:
        """Bring every rank's updated shards to all ranks: at once, or only issued while prefetching."""
        if self.prefetching:
            self.exchange.start(self.first_use)
        else:
            self.exchange.run()

    def wait_for_exchange(self, params: Iterable[int] | None = None) -> None:
        """Finish an exchange in flight: the units holding the parameters with these global
        indices, or all of it."""
        self.exchange.wait(params)

    def track_in_flight(self, params: frozenset[int], inflight: InFlight) -> None:
        """Make :meth:`wait_for_exchange` also wait for ``inflight`` (collectives writing the
        parameters with global indices ``params``, e.g. the overlap hooks' sends)."""
        self.exchange.track(params, inflight)

    def start_prefetch(self) -> None:
        """From now on :meth:`step` only issues the exchange; whoever reads a parameter waits for
        it first (:func:`zero_lab.overlap.prefetch_exchange`'s forward pre-hooks)."""
        self.prefetching = True
        if self.exchange_timing == "after_step":
            self.exchange_timing = "next_forward"

    def stop_prefetch(self) -> None:
        """Wait for an exchange in flight; :meth:`step` exchanges synchronously again."""
        self.exchange.wait()
        self.prefetching = False
        if self.exchange_timing == "next_forward":
            self.exchange_timing = "after_step"

    def note_first_use(self, params: Iterable[int]) -> None:
        """A forward is about to read the parameters with these global indices (:attr:`first_use`
        orders the next exchange's units by it)."""
        self.first_use.note(params)

    @property
    def exchange_units(self) -> int:
        """How many separately awaitable units (buffers, or shards) the exchange issues per
        step; with ``auto`` still undecided, the most any candidate collective would."""
        return self.exchange.unit_count

    def exchange_report(self, requested: str) -> ExchangeReport:
        """The exchange's layout and collective (per bucket: the overlap hooks' broadcasts)."""
        if self.exchange_timing == "per_bucket":
            return ExchangeReport("overlap_per_bucket", "overlap", "broadcast", requested)
        return self.exchange.report()

    def report(self, requested_exchange: str) -> dict[str, Any]:
        """Every phase in order: what reduces, how many shards this rank steps, what exchanges when."""
        return {
            "grad_reduce": self.grad_reduce.report(),
            "step": {"local_params": len(self.local_index), "fp32_masters": len(self.masters)},
            "param_exchange": {
                **self.exchange_report(requested_exchange).as_dict(),
                "timing": self.exchange_timing,
            },
        }
