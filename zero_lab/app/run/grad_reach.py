"""Which parameters get a gradient, found before the first step, so the owners are balanced
over the parameters that get optimizer state.

With ``dist.find_unused_parameters=true`` (or ``dist.static_graph=true``) a model may hold
parameters its forward never uses — the own-model page's ``aux`` layer. They never receive a
gradient, so never optimizer state; a partitioner pricing them like the rest hands their
owner nothing to hold: the page's example at W=2 put ``aux`` (its largest matrix) on rank 0
and everything else on rank 1, ``optim_state_bytes`` ``[0, 44120]``, and sharding saved
nothing.

Algorithm (:func:`params_never_reached`): rank 0 builds the model a second time on
``meta`` tensors (no memory, no arithmetic), runs its own first batch forward, the loss and
backward — the same probe the pre-start check runs (:func:`zero_lab.app.workloads.protocols.forward_problems`)
— and lists the parameters left without a gradient; the list is broadcast so every rank
partitions alike. The runner finds them *before* it builds the optimizer and passes them
to :func:`zero_lab.app.run.build.build_training` (``without_grad=``), which constructs the
optimizer with its partitioner wrapped in :class:`zero_lab.partition.WithoutGradients`
(those priced at nothing, ``ParamSpec.gets_grad=False``): the partition is built once.

Why a meta probe and not the first real backward: the partition must exist before the first
step (a resume loads its state into it), and the probe costs no memory. What it cannot see:
a parameter the first batch leaves unused but a later one uses is priced at nothing and still
stepped correctly, only less balanced; a model whose forward cannot run on meta tensors is
partitioned as before. Not with ``overlap=true``: there the shards are bound to DDP's hook
when it attaches, before the data exists.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig

from zero_lab.app.workloads.protocols import OUTPUT_KEY, batch_stream, call_model, loss_of, to_device

__all__ = ["params_never_reached", "params_without_grad"]

log = logging.getLogger(__name__)


def params_without_grad(cfg: DictConfig, data: Any, world_size: int) -> list[str] | None:
    """Names of the trainable parameters a meta forward/backward of rank 0's first batch leaves
    without a gradient; ``None`` when the model or data cannot be probed on meta tensors."""
    try:
        with torch.device("meta"):
            model = instantiate(cfg.model)
        inputs, targets = next(batch_stream(data, 0, world_size, 0))
        output = call_model(model, to_device(inputs, torch.device("meta")))
        meta_targets = targets.to("meta") if torch.is_tensor(targets) else targets
        loss_of(output, meta_targets, data, str(cfg.get("output_key", OUTPUT_KEY))).backward()
    except Exception as error:  # an op without a meta kernel, data-dependent control flow...
        log.info("the parameters without gradients could not be found on meta tensors (%s)", error)
        return None
    return [name for name, param in model.named_parameters() if param.requires_grad and param.grad is None]


def params_never_reached(cfg: DictConfig, data: Any, shards_state: bool) -> list[str]:
    """The names of the parameters a ZeRO optimizer should price at nothing (see the module
    docstring): empty when nothing is left unused or nothing applies (a plain optimizer,
    ``overlap=true``, or DDP that allows no unused parameter). Collective: call on every rank,
    before building the optimizer (``build_training(..., without_grad=names)``)."""
    unused_allowed = bool(cfg.dist.get("find_unused_parameters") or cfg.dist.get("static_graph"))
    if not (shards_state and unused_allowed) or cfg.get("overlap"):
        return []
    found = [params_without_grad(cfg, data, dist.get_world_size()) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)  # every rank partitions alike; bounded by the group's timeout
    names = found[0] or []
    if names:
        log.info("parameters without gradients, priced at nothing when partitioning: %s", ", ".join(names))
    return names
