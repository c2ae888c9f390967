"""Build what a rank trains: model, DDP wrapper, optimizer — in the order they must be made.

One function, :func:`build_training`, owns the order, because the overlap mode ties the
three together (the optimizer steps inside DDP's communication hook):

1. the model, seeded identically on every rank (DDP would broadcast rank 0's anyway);
2. the DDP wrapper (its gradient buckets are what ``partitioner=ddp_bucket`` follows);
3. the optimizer from ``cfg.optim`` (a ``_partial_`` target): plain ``torch.optim`` for the
   baselines, ``zero_lab.ZeroRedundancyOptimizer`` with the partitioner, ``bucket_view``
   and ``overlap`` passed in for the zero_* options;
4. with ``overlap=true``, the ZeRO step hook registered on DDP.

    training = build_training(cfg, torch.device("cpu"))
    loss = data.loss(training.ddp(x), y); loss.backward(); training.optimizer.step()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import Optimizer

from zero_lab.app.validate import is_zero

__all__ = ["Training", "build_training"]


@dataclass
class Training:
    """The model (unwrapped), its DDP wrapper and the optimizer of one rank."""

    model: nn.Module
    ddp: DDP
    optimizer: Optimizer
    zero: bool


def build_training(cfg: DictConfig, device: torch.device) -> Training:
    """Model -> DDP -> optimizer (-> overlap hook); see the module docstring for why."""
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model).to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=cfg.dist.bucket_cap_mb)
    zero = is_zero(cfg.optim)
    make_optimizer = instantiate(cfg.optim)
    if zero:
        optimizer = make_optimizer(
            model.named_parameters(),
            partitioner=instantiate(cfg.partitioner),
            parameters_as_bucket_view=cfg.bucket_view,
            overlap_with_ddp=cfg.overlap,
        )
        if cfg.overlap:
            _attach_overlap(ddp, optimizer)
    else:
        optimizer = make_optimizer(model.parameters())
    return Training(model=model, ddp=ddp, optimizer=optimizer, zero=zero)


def _attach_overlap(ddp: DDP, optimizer: Any) -> None:
    """Run the ZeRO step inside DDP's all-reduce hook (torch's ``hook_with_zero_step`` shape).

    The config check refuses ``overlap=true`` until ``zero_lab.overlap`` exists; wire its
    final signature here when it lands.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab import overlap  # type: ignore[attr-defined]

    ddp.register_comm_hook(None, overlap.hook_with_zero_step(allreduce_hook, ddp, optimizer))


def optimizer_state_bytes(optimizer: Optimizer) -> int:
    """Bytes of every tensor in this rank's optimizer state (the local shard's, for ZeRO)."""
    local = getattr(optimizer, "optim", optimizer)
    total = 0
    for state in local.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total
