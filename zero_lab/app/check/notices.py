"""What a job says as it starts about a config that runs, but not as its user may think: overrides
a plain optimizer does not use, ranks ``partitioner=ddp_bucket`` leaves without state, and
``optim.param_groups.to_muon`` globs that match parameters Muon never takes.

    for line in notices(cfg, overrides, plan): log.info(line)
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.utils import get_object
from omegaconf import DictConfig

from zero_lab.app.config.overrides import read
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.partition import bucket_use
from zero_lab.routing import muon_param_groups, never_to_muon

__all__ = ["notices"]


def notices(cfg: DictConfig, overrides: Sequence[str], plan: RunPlan) -> list[str]:
    """The lines printed when the job ``cfg`` starts; ``plan``: the job's, as the check made it."""
    assert plan.optim is not None, "notices of a checked config: its optimizer can be looked up"
    unused = [o.text for o in read(overrides) if o.root in plan.optim.strategy.unused_keys]
    said = [
        f"{' '.join(unused)}: not used by {cfg.optim._target_}, a plain optimizer (every rank keeps the "
        "full state); pick optim=zero_* to shard"
    ]
    return _idle_ranks(cfg, plan) + _muon_globs(cfg, plan) + (said if unused else [])


def _idle_ranks(cfg: DictConfig, plan: RunPlan) -> list[str]:
    """``partitioner=ddp_bucket`` gives each DDP bucket wholly to one rank: a model that fits
    fewer buckets than ranks leaves ranks without state (one bucket: all of it on rank 0)."""
    world = cfg.dist.world_size
    partitioner, specs = plan.partitioner.value, plan.specs  # None unless ZeRO and built
    if partitioner is None or specs is None or not cfg.overlap or world < 2:
        return []
    if bucket_use(partitioner) != (True, False):  # only whole buckets can leave a rank idle
        return []
    buckets = len({s.bucket for s in specs if s.trainable})
    if buckets >= world:
        return []
    return [
        f"partitioner=ddp_bucket: the model's trainable parameters fit {buckets} DDP bucket(s) "
        f"(dist.bucket_cap_mb={cfg.dist.bucket_cap_mb}) and each goes wholly to one rank, so "
        f"{world - buckets} of {world} ranks hold no optimizer state"
        f"{' and rank 0 keeps all of it (÷ 1.00)' if buckets == 1 else ''}; add partitioner.shard_buckets=true "
        "to cut every bucket across the ranks, or lower dist.bucket_cap_mb"
    ]


def _muon_globs(cfg: DictConfig, plan: RunPlan) -> list[str]:
    """``optim.param_groups.to_muon`` globs that match parameters that are not 2-D: those never go
    to Muon (:func:`zero_lab.routing.never_to_muon`); say so rather than drop them silently."""
    node = cfg.optim.get("param_groups")
    if node is None or not node.get("to_muon") or get_object(str(node.get("_target_"))) is not muon_param_groups:
        return []
    if plan.model.value is None:  # the check reports it
        return []
    left_out = never_to_muon(plan.model.value, list(node.to_muon))
    out = []
    for glob, names in left_out.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(
            f"optim.param_groups.to_muon: '{glob}' matches {len(names)} parameter(s) that are not 2-D ({shown}); "
            "Muon steps only matrices, so 1-D (and other non-2-D) parameters never go to it: they stay with the "
            "optimizer's default class (optim.optimizer_class); match only 2-D weights with to_muon"
        )
    return out
