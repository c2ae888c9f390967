"""What one rank trains with, made by :func:`zero_lab.app.run.build.build_training`: a module of its
own so that the loop, the checkpoints and the memory accounting need not import the builder."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from zero_lab.app.plan.data_parallel import DpChoice
from zero_lab.app.plan.strategy import Strategy
from zero_lab.app.record.metrics import LocalStepClock
from zero_lab.comm import CommStats
from zero_lab.grad_reduce import GradReduceHandle

__all__ = ["Training"]


@dataclass
class Training:
    """The model (unwrapped), its DDP wrapper and the optimizer of one rank. ``exchange_stats``: the
    parameter exchange's running meter (with overlap its broadcasts run inside backward: ``seconds``
    spans issue to wait, ``exposed_seconds`` is what the loop waited)."""

    model: nn.Module
    ddp: DDP
    optimizer: Optimizer
    zero: bool  # the optimizer shards its state (``strategy`` answers what that changes)
    exchange_stats: CommStats | None = None  # None: a plain optimizer, no exchange
    grad_reducer: GradReduceHandle | None = None  # the grad_reduce= hook (its stats meter the reduction)
    grad_stats: CommStats | None = None  # the gradient reduction's meter: the grad_reduce= hook's, or the engine's
    max_grad_norm: float | None = None
    scheduler: LRScheduler | None = None  # stepped once per optimizer step (scheduler=...)
    scaler: torch.amp.GradScaler | None = None  # autocast=fp16: loss scaling
    # which path trains and why (dp=auto resolved); zero_lab: ``ddp`` is the engine, zero_lab.ShardedDataParallel
    dp_choice: DpChoice = field(default_factory=lambda: DpChoice("ddp", "ddp", "dp=ddp, as set"))
    step_clock: LocalStepClock = field(init=False)  # the local optimizer step's seconds (time/optim_step_s)

    def __post_init__(self) -> None:
        self.step_clock = LocalStepClock(self.optimizer)

    @property
    def dp(self) -> str:
        """``ddp`` or ``zero_lab``: the path that trains."""
        return self.dp_choice.dp

    @property
    def strategy(self) -> Strategy:
        """Plain DDP or ZeRO (:mod:`zero_lab.app.plan.strategy`): what differs between them, asked of one object."""
        return Strategy.of(self.zero, self.dp)

    @property
    def param_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype
