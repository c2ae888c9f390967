"""The parameters that never get a gradient, as every rank partitions them.

The job's run plan finds them once, on its meta model
(:attr:`zero_lab.app.plan.run_plan.RunPlan.never_reached`, algorithm in
:mod:`zero_lab.app.plan.grad_reach`), and the run spec carries the answer to the ranks.
:func:`params_never_reached` hands each rank rank 0's copy — under torchrun or srun every rank
planned its own job — so every rank partitions alike; the runner passes the names to
:func:`zero_lab.app.run.build.build_training` (``without_grad=``) before it builds the optimizer.

    unused = params_never_reached(spec.never_reached)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch.distributed as dist

__all__ = ["params_never_reached"]

log = logging.getLogger(__name__)


def params_never_reached(planned: Sequence[str] | None) -> list[str]:
    """Rank 0's ``planned`` names (``RunPlan.never_reached``) on every rank; ``[]`` when the plan
    says nothing applies (``None``: a plain optimizer, ``overlap=true``, DDP that allows no unused
    parameter — a config fact, alike on every rank). Collective when it applies: call on every
    rank, before building the optimizer (``build_training(..., without_grad=names)``)."""
    if planned is None:
        return []
    found = [list(planned) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)  # every rank partitions alike; bounded by the group's timeout
    names = found[0] or []
    if names:
        log.info("parameters without gradients, priced at nothing when partitioning: %s", ", ".join(names))
    return names
