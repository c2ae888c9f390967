"""The config check of ``grad_reduce=`` and ``shard_grads=`` (one of :mod:`zero_lab.app.check.rules`'s rules).

``grad_reduce`` reduces each gradient to the rank that steps it (:mod:`zero_lab.grad_reduce`), so
it needs a ZeRO optimizer, except ``all_reduce`` (DDP's traffic, metered: the baseline for the
bytes per phase, any optimizer). ``shard_grads`` keeps only owned gradients, so it needs a ZeRO
optimizer and a ``grad_reduce`` hook (any strategy). ``autocast=fp16`` is refused with it: the GradScaler would look for
infs in this rank's owned gradients only, and ranks that disagree on skipping a step would issue
different exchanges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from zero_lab.app.check.options import either, zero_options
from zero_lab.app.config.schema import enum_str
from zero_lab.app.plan.run_plan import RunPlan

__all__ = ["check_grad_reduce"]


def check_grad_reduce(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """One line per problem with ``grad_reduce=`` / ``shard_grads=``, naming the keys and the fix."""
    name = enum_str(cfg.grad_reduce) if cfg.get("grad_reduce") is not None else None
    shard = bool(cfg.get("shard_grads", False))
    strategy = plan.strategy  # None: the optimizer cannot be looked up (reported elsewhere)
    steps_every_parameter = strategy is not None and not strategy.shards_state
    optim = choices.get("optim") or "this optimizer"
    out = []
    if name is not None and name != "all_reduce" and steps_every_parameter:
        out.append(
            f"grad_reduce={name}: optim={optim} steps every parameter, so it needs every gradient; use a ZeRO "
            f"optimizer ({either('optim', zero_options())}), or grad_reduce=all_reduce (DDP's traffic, metered) or null"
        )
    if shard and name is None:
        out.append(
            "shard_grads=true with grad_reduce=null: DDP's own all-reduce keeps every gradient; add "
            "grad_reduce=reduce_scatter (or auto, or all_reduce: DDP's traffic, owned gradients kept only)"
        )
    elif shard and steps_every_parameter:
        out.append(
            f"shard_grads=true: optim={optim} steps every parameter, so it needs every gradient; use a ZeRO "
            "optimizer, or shard_grads=false"
        )
    autocast = enum_str(cfg.autocast) if cfg.get("autocast") is not None else None
    if name is not None and name != "all_reduce" and autocast == "fp16":
        out.append(
            f"autocast=fp16 with grad_reduce={name}: the GradScaler's inf check would see only this rank's owned "
            "gradients, and ranks skipping different steps would hang the exchange; use autocast=bf16, or "
            "grad_reduce=all_reduce"
        )
    return out
