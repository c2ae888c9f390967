"""What a rank's loop ends with: replicas checked alike, and rank 0's ``summary.json``.

:func:`agreed_checksum` hashes each rank's parameters (SHA-256 over name, shape, dtype and bytes,
in registration order) and all-gathers the hashes: a rank that differs fails the run.
:func:`summarize` builds the :class:`~zero_lab.app.record.summary.RunSummary` from the step records
(medians over every step but the first, which pays one-off costs) and prices the "÷ DDP" baseline
over the parameters some rank holds state for (:func:`held_anywhere`, every rank).

    checksum = agreed_checksum(training.model, gather)
    held = held_anywhere(training, gather)
    summary = summarize(cfg, specs, meta, training, losses, records, checksum, start, held)  # rank 0
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from zero_lab.app.plan.run_plan import shard_size_of
from zero_lab.app.record.catalogue import (
    CATALOGUE,
    IMBALANCE,
    MASTER_WEIGHT_BYTES,
    OPTIM_STATE_BYTES,
    PEAK_BYTES,
    TENSOR_BYTES,
    VAL_LOSS,
)
from zero_lab.app.record.metrics import MetricsGather, local_step_summary, phase_summary
from zero_lab.app.record.summary import PROVENANCE, RunSummary
from zero_lab.app.run.checkpoints import Restored
from zero_lab.app.run.memory import ddp_state_bytes, optimizer_classes
from zero_lab.app.run.training import Training
from zero_lab.elementwise import is_elementwise
from zero_lab.partition import ParamSpec
from zero_lab.runtime.signals import signal_name

__all__ = ["agreed_checksum", "held_anywhere", "summarize"]


def agreed_checksum(model: torch.nn.Module, gather: MetricsGather) -> str:
    """Every rank hashes its replica; all-gather the hashes and fail if any rank differs."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    mine = digest.hexdigest()
    words = torch.frombuffer(bytearray(digest.digest()), dtype=torch.int64).to(gather.device)  # the hash as 4 words
    everyone = torch.zeros(4 * gather.world_size, dtype=torch.int64, device=gather.device)
    gather.comm.all_gather_into(everyone, words, op="checksum")
    rows = everyone.view(gather.world_size, 4).cpu().tolist()
    differing = [r for r, row in enumerate(rows) if row != rows[0]]
    if differing:
        raise RuntimeError(f"replicas diverged: ranks {differing} hold different parameters than rank 0")
    return mine


def held_anywhere(training: Training, gather: MetricsGather) -> list[bool]:
    """Per parameter of the optimizer's param groups: whether any rank holds state for it
    (the strategy's ``params_with_state``, a MAX all-reduce under the dist timeout)."""
    held = training.strategy.params_with_state(training.optimizer)
    mine = torch.tensor(held, dtype=torch.float32, device=gather.device)
    gather.comm.all_reduce(mine, dist.ReduceOp.MAX, op="state_mask")
    return [bool(flag) for flag in mine.cpu().tolist()]


def summarize(
    cfg: DictConfig,
    specs: Sequence[ParamSpec],
    meta: dict[str, Any],
    training: Training,
    losses: list[float],
    records: list[dict[str, Any]],
    checksum: str,
    start: int,
    held: list[bool] | None = None,
    stopped_by: int = 0,
    resumed: Restored | None = None,
) -> RunSummary:
    """summary.json (:class:`~zero_lab.app.record.summary.RunSummary`): the contract scripts and dashboards read."""
    world = dist.get_world_size()
    timed = records[1:] or records  # the first step pays one-off allocation costs
    last = records[-1] if records else {}

    def last_per_rank(key: Any) -> list[float]:
        return [last.get(key(f"rank{r}"), 0.0) for r in range(world)]

    def median(key: str) -> float | None:
        return statistics.median(r[key] for r in timed) if timed else None

    optim_state = last_per_rank(OPTIM_STATE_BYTES.at)
    planned = ddp_state_bytes(specs, training.optimizer, held)  # planned, for "÷ DDP": like with like
    classes = optimizer_classes(training.optimizer)
    evaluated = [r[VAL_LOSS.key] for r in records if VAL_LOSS.key in r]
    medians = {m.median: median(m.at("max") if m.per_rank else str(m.key)) for m in CATALOGUE if m.median}
    return RunSummary(
        final_loss=losses[-1],
        losses=losses,
        world_size=world,
        steps=cfg.steps,
        param_checksum=checksum,
        start_step=start,
        resumed_from=str(cfg.resume) if cfg.resume is not None else None,
        zero=training.zero,
        dp=training.dp,
        dp_choice=training.dp_choice.as_dict(),
        engine=training.strategy.engine_report(training.optimizer),
        bucket_view=bool(cfg.bucket_view),
        overlap=bool(cfg.overlap),
        exchange_mode=training.strategy.exchange_mode(training.optimizer),
        exchange=training.strategy.exchange_report(training.optimizer),
        prefetch=bool(cfg.get("prefetch", False)),
        model_params=sum(p.numel() for p in training.model.parameters()),
        global_batch=cfg.data.global_batch,
        param_dtype=str(cfg.param_dtype),
        master_weights=bool(cfg.optim.get("master_weights", False)),
        max_grad_norm=cfg.optim.get("max_grad_norm"),
        optim_state_bytes=optim_state,
        master_weight_bytes=last_per_rank(MASTER_WEIGHT_BYTES.at),
        tensor_bytes=last_per_rank(TENSOR_BYTES.at),
        peak_bytes=last_per_rank(PEAK_BYTES.at),
        ddp_state_bytes=planned,
        optimizer_classes=[cls.__name__ for cls in classes],
        elementwise=all(is_elementwise(cls) for cls in classes),
        imbalance=last.get(str(IMBALANCE.key), 1.0),
        **medians,  # step_time_s, exchange_time_s, ...
        final_val_loss=evaluated[-1] if evaluated else None,
        best_val_loss=min(evaluated) if evaluated else None,
        accumulate=cfg.get("accumulate", 1),
        eval_every=int(cfg.get("eval_every") or 0),
        eval_batches=cfg.get("eval_batches") if cfg.get("eval_every") else None,
        autocast=str(cfg.get("autocast")) if cfg.get("autocast") is not None else None,
        compile=bool(cfg.get("compile", False)),
        # how many graphs torch.compile made on this rank (1 + graph breaks + recompiles)
        compiled_graphs=int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) if cfg.get("compile") else None,
        **local_step_summary(timed, world),  # each rank's median local optimizer step, slowest ÷ mean
        state_vs_ddp=max(optim_state) / planned if planned else None,
        partition=training.strategy.partition_report(training.optimizer),
        shard_size=shard_size_of(cfg),
        provenance={k: v for k, v in meta.items() if k in PROVENANCE},
        stopped_by=signal_name(stopped_by) if stopped_by else None,
        **phase_summary(training, timed, world),
        resume_optimizer=str(cfg.resume_optimizer) if resumed is not None else None,
        resume_overridden=resumed.overridden if resumed is not None else None,
        resumed_checkpoint=str(resumed.path) if resumed is not None else None,
    )
