"""The ZeRO step as one pipeline of three phases, built once with the optimizer.

    reduce gradients  ->  step the owned shards  ->  exchange parameters

:class:`StepPipeline` is that object: what the partition decides (who owns which elements),
the local optimizer over this rank's shards (the *step* phase, with its proxies and fp32
masters), the :class:`~zero_lab.exchange.ParamExchange` (the *exchange* phase) and the
gradient-reduction phase. :class:`~zero_lab.optimizer.ZeroRedundancyOptimizer` builds it in
its constructor, from the partitioner and DDP's buckets (given, or modelled with DDP's
default caps, :mod:`zero_lab.ddp_buckets`), and never rebuilds it: a new param group extends
it in place (:meth:`~zero_lab.optimizer.ZeroRedundancyOptimizer.add_param_group`), and a
trainability change only re-lays the exchange's buffers.

Each phase's *strategy* is a small runtime-checkable Protocol whose implementations register
by name in a :class:`~zero_lab.registry.Registry` (``exchange=``: :class:`zero_lab.collectives.Collective`;
``grad_reduce=``: :class:`zero_lab.grad_reduce.GradReduce`). Each phase's *timing* is a
choice made once, at attach time:

* gradients — by DDP's own all-reduce in backward (:class:`DdpAllReduce`, the default), or
  per DDP bucket inside DDP's comm hook by a registered strategy
  (:func:`zero_lab.grad_reduce.reduce_gradients` attaches its handle with
  :meth:`StepPipeline.attach_grad_reduce`);
* step and exchange — after backward (``step()``), behind the next forward
  (:func:`zero_lab.overlap.prefetch_exchange`), or per bucket inside DDP's hook
  (:mod:`zero_lab.overlap`, which attaches with :meth:`StepPipeline.attach_per_bucket`).

An attach records the phase on the pipeline; it builds nothing, so the partition, the local
optimizer and the exchange are the constructor's whatever attaches later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from zero_lab.chained import ChainedOptimizer
from zero_lab.exchange import ExchangeReport, ParamExchange
from zero_lab.partition import Partition

__all__ = ["EXCHANGE_TIMINGS", "DdpAllReduce", "GradReducePhase", "StepPipeline"]

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


@dataclass
class StepPipeline:
    """The three phases of one optimizer, built together once (see the module docstring).

    ``partition``: who steps which elements. ``optim``: the local optimizer over this rank's
    shards (the step phase); ``local_index`` maps its parameter positions to global indices;
    ``proxies`` are ``(tensor, param, start, stop)`` for tensors standing in for a parameter
    (slices; whole parameters too with overlap; the fp32 ``masters`` among them).
    ``exchange``: the parameter exchange. ``grad_reduce``: the gradient phase.
    ``exchange_timing``: one of :data:`EXCHANGE_TIMINGS`.
    """

    partition: Partition
    trainable: list[bool]
    exchange: ParamExchange
    optim: ChainedOptimizer = field(init=False)
    local_index: list[int] = field(default_factory=list)
    proxies: list[tuple[torch.Tensor, torch.Tensor, int, int]] = field(default_factory=list)
    masters: list[tuple[torch.Tensor, torch.Tensor, int, int]] = field(default_factory=list)
    grad_reduce: GradReducePhase = field(default_factory=DdpAllReduce)
    exchange_timing: str = "after_step"

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

    def attach_per_bucket(self) -> None:
        """Step and exchange run per DDP bucket inside DDP's hook (:mod:`zero_lab.overlap`)."""
        self.exchange_timing = "per_bucket"

    # ------------------------------------------------------------------ step phase
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
