"""Which parameters get a gradient, found when the job is planned, so the ZeRO owners are
balanced over the parameters that get optimizer state.

With ``dist.find_unused_parameters=true`` (or ``dist.static_graph=true``) a model may hold
parameters its forward never uses — the own-model page's ``aux`` layer. They never receive a
gradient, so never optimizer state; a partitioner pricing them like the rest hands their
owner nothing to hold: the page's example at W=2 put ``aux`` (its largest matrix) on rank 0
and everything else on rank 1, ``optim_state_bytes`` ``[0, 44120]``, and sharding saved
nothing.

Algorithm (:func:`params_without_grad`): on the run plan's meta model (no memory, no
arithmetic), run rank 0's first batch forward, the loss and backward — the probe the pre-start
check runs (:func:`zero_lab.app.workloads.protocols.forward_problems`) — and list the trainable
parameters left without a gradient; the gradients are cleared again, so the plan's model is
left as it was. :attr:`zero_lab.app.plan.run_plan.RunPlan.never_reached` asks it once per job;
the run spec carries the answer to the ranks, which build the optimizer with its partitioner
wrapped in :class:`zero_lab.partition.WithoutGradients` (those priced at nothing,
``ParamSpec.gets_grad=False``): the partition is built once.

Why a meta probe and not the first real backward: the partition must exist before the first
step (a resume loads its state into it), and the probe costs no memory. What it cannot see:
a parameter the first batch leaves unused but a later one uses is priced at nothing and still
stepped correctly, only less balanced; a model whose forward cannot run on meta tensors is
partitioned as before. Not with ``overlap=true``: there the shards are bound to DDP's hook
when it attaches, before the data exists.

    names = params_without_grad(plan.model.value, plan.data.value, 2, "logits", torch.float32)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from zero_lab.app.workloads.protocols import batch_stream, call_model, loss_of, to_device

__all__ = ["params_without_grad"]

log = logging.getLogger(__name__)


def params_without_grad(
    model: nn.Module, data: Any, world_size: int, output_key: str, float_dtype: torch.dtype | None = None
) -> list[str] | None:
    """Names of the trainable parameters of ``model`` (built on ``meta``) that a forward/backward
    of rank 0's first batch leaves without a gradient; ``None`` when the model cannot be probed on
    meta tensors. The pre-start check has run this forward and loss already (any other error of
    the model or the data is reported there), so only the meta device's own limits are caught."""
    inputs, targets = next(batch_stream(data, 0, world_size, 0))
    meta_targets = targets.to("meta") if torch.is_tensor(targets) else targets
    try:
        output = call_model(model, to_device(inputs, torch.device("meta"), float_dtype))
        loss_of(output, meta_targets, data, output_key).backward()
        return [name for name, param in model.named_parameters() if param.requires_grad and param.grad is None]
    except (NotImplementedError, RuntimeError) as error:  # an op without a meta kernel, data-dependent control flow
        log.info("the parameters without gradients could not be found on meta tensors (%s)", error)
        return None
    finally:
        for param in model.parameters():
            param.grad = None  # the plan's model stays as the other readers found it
