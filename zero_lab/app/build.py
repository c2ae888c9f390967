"""Build what a rank trains: model, DDP wrapper, optimizer — in the order they must be made.

One function, :func:`build_training`, owns the order, because the overlap mode ties the
three together (the optimizer steps inside DDP's communication hook):

1. the model, seeded identically on every rank (DDP would broadcast rank 0's anyway),
   in ``param_dtype`` (built in fp32, then cast, so every dtype starts from the same weights);
2. the DDP wrapper (its gradient buckets are what ``partitioner=ddp_bucket`` follows);
3. the optimizer from ``cfg.optim`` (a ``_partial_`` target): plain ``torch.optim`` for the
   baselines, ``zero_lab.ZeroRedundancyOptimizer`` with the partitioner, ``bucket_view``
   and ``overlap`` passed in for the zero_* options (``optim.master_weights`` goes to it;
   ``optim.max_grad_norm`` is the loop's, see :func:`clip_gradients`);
4. with ``overlap=true``, the ZeRO step hook (``overlap_hook``) registered on DDP; it
   re-partitions along DDP's buckets, which ``partitioner=ddp_bucket`` follows.

    training = build_training(cfg, torch.device("cpu"))
    loss = data.loss(training.ddp(x), y); loss.backward(); training.optimizer.step()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import Optimizer

from zero_lab.app.validate import enum_str, is_zero
from zero_lab.comm import CommStats
from zero_lab.measure import optimizer_state_bytes  # re-exported: the app counts state bytes with the core

__all__ = [
    "APP_OPTIM_KEYS",
    "Training",
    "build_training",
    "clip_gradients",
    "optimizer_factory",
    "optimizer_state_bytes",
]

#: Keys of the ``optim`` group that the training loop reads and the optimizer never sees.
APP_OPTIM_KEYS = ("max_grad_norm",)

PARAM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Training:
    """The model (unwrapped), its DDP wrapper and the optimizer of one rank.

    ``exchange_stats`` is the running :class:`~zero_lab.comm.CommStats` of the parameter
    exchange, ``optimizer.comm_stats`` (with overlap the hook meters into it too; its
    broadcasts run inside backward, asynchronously, so their bytes and calls are counted
    but not their time); ``None`` for plain optimizers.
    """

    model: nn.Module
    ddp: DDP
    optimizer: Optimizer
    zero: bool
    exchange_stats: CommStats | None = None
    max_grad_norm: float | None = None

    @property
    def param_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def build_training(cfg: DictConfig, device: torch.device) -> Training:
    """Model -> DDP -> optimizer (-> overlap hook); see the module docstring for why."""
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model).to(device=device, dtype=PARAM_DTYPES[enum_str(cfg.param_dtype)])
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=cfg.dist.bucket_cap_mb)
    zero = is_zero(cfg.optim)
    make_optimizer = optimizer_factory(cfg.optim)
    max_grad_norm = cfg.optim.get("max_grad_norm")
    if not zero:
        optimizer = make_optimizer(model.parameters())
        return Training(model=model, ddp=ddp, optimizer=optimizer, zero=False, max_grad_norm=max_grad_norm)
    optimizer = make_optimizer(
        model.named_parameters(),
        partitioner=instantiate(cfg.partitioner),
        parameters_as_bucket_view=cfg.bucket_view,
        overlap_with_ddp=cfg.overlap,
    )
    if cfg.overlap:
        _attach_overlap(ddp, optimizer, enum_str(cfg.overlap_hook))
    return Training(
        model=model,
        ddp=ddp,
        optimizer=optimizer,
        zero=True,
        exchange_stats=optimizer.comm_stats,  # with overlap too: the hook meters into it
        max_grad_norm=max_grad_norm,
    )


def clip_gradients(training: Training) -> float | None:
    """Clip to ``optim.max_grad_norm`` between backward and step; returns the pre-clip norm.

    ZeRO: :meth:`~zero_lab.ZeroRedundancyOptimizer.clip_grad_norm_` (each rank's norm of
    the elements it owns, one scalar all-reduce). Plain optimizers: every rank holds every
    (all-reduced) gradient, so ``torch.nn.utils.clip_grad_norm_`` needs no communication.
    ``None`` when clipping is off.
    """
    if training.max_grad_norm is None:
        return None
    if training.zero:
        norm = training.optimizer.clip_grad_norm_(training.max_grad_norm)  # type: ignore[attr-defined]
    else:
        norm = torch.nn.utils.clip_grad_norm_(training.model.parameters(), training.max_grad_norm)
    return float(norm)


def optimizer_factory(optim_cfg: DictConfig) -> Any:
    """``cfg.optim`` as a partial ``(params, **kwargs) -> Optimizer``, without the loop's keys."""
    kept = OmegaConf.create({k: v for k, v in optim_cfg.items() if k not in APP_OPTIM_KEYS})
    return instantiate(kept)


def _attach_overlap(ddp: DDP, optimizer: Any, hook: str) -> None:
    """Step the optimizer inside DDP's all-reduce hook (``overlap_hook``: which of the two)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab import overlap

    make_hook = overlap.hook_with_zero_step_interleaved if hook == "interleaved" else overlap.hook_with_zero_step
    shard_buckets = bool(getattr(optimizer.partitioner, "shard_buckets", False))
    comm_hook = make_hook(allreduce_hook, ddp, optimizer, shard_buckets=shard_buckets)
    ddp.register_comm_hook(None, comm_hook)


def master_weight_bytes(optimizer: Optimizer) -> int:
    """Bytes of this rank's fp32 master shards (``optim.master_weights``; 0 otherwise)."""
    measure = getattr(optimizer, "master_weight_bytes", None)
    return measure() if measure is not None else 0
