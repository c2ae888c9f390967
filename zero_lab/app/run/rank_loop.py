"""The training loop of one rank; the same code under ``run_world`` and under ``torchrun``.

:func:`train_rank` runs inside an initialised process group:

1. the rank's log, its device (``cuda:LOCAL_RANK`` or CPU), the data, model -> DDP -> optimizer
   (:mod:`zero_lab.app.run.build`; the ZeRO owners balanced over the parameters that get gradients);
2. with ``resume=``, the checkpoint, loaded on every rank (any world size, any format);
3. each step: reseed from ``(seed, rank, step)`` (a resumed run draws what the uninterrupted one
   drew), this rank's batch (:func:`zero_lab.app.workloads.protocols.batch_stream`), one measured
   step (:func:`zero_lab.app.run.step.measured_step`), one all-gather of every rank's measurements;
4. a NaN/Inf loss on any rank stops every rank in that step (:class:`NonFiniteLoss`, before any
   checkpoint of the diverged state); every ``checkpoint_every`` steps, save
   (:mod:`zero_lab.app.run.checkpoints`), keeping the ``keep_checkpoints`` newest; after a
   SIGTERM/SIGINT/SIGUSR2 on any rank (:mod:`zero_lab.runtime.signals`), every rank finishes the
   step, saves (a requeued job resumes from it) and leaves the loop in the same step;
5. at the end, check all ranks hold the same parameters; rank 0 writes ``summary.json``
   (:mod:`zero_lab.app.run.finish`).

Only rank 0 writes shared files (``metrics.jsonl``, ``summary.json``, the model, the manifest).
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from zero_lab.app.config.schema import enum_str
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.record.catalogue import EXCHANGE_MODE, LOSS, LR, VAL_LOSS
from zero_lab.app.record.metrics import MetricsGather, RankStep, step_record
from zero_lab.app.record.progress import Progress
from zero_lab.app.record.run_files import METRICS_FILE, SUMMARY_FILE
from zero_lab.app.record.sinks import JsonlSink, MetricSink, make_logger_sink
from zero_lab.app.run import checkpoints as run_checkpoints
from zero_lab.app.run.build import build_training, params_never_reached
from zero_lab.app.run.finish import agreed_checksum, held_anywhere, summarize
from zero_lab.app.run.rank_errors import next_batch, unused_parameters
from zero_lab.app.run.rank_log import log_to_file
from zero_lab.app.run.step import StepOptions, measured_step, validation_loss
from zero_lab.app.workloads.data import stream_seed
from zero_lab.app.workloads.protocols import batch_stream
from zero_lab.files import write_json
from zero_lab.partition import ParamSpec
from zero_lab.runtime import heartbeat
from zero_lab.runtime.signals import StopRequest, signal_name

__all__ = ["RANK_PRELOAD", "NonFiniteLoss", "RankResult", "RunSpec", "train_rank"]

log = logging.getLogger("zero_lab.app")

#: What a rank imports: this module, and the entry point ``train.py`` (re-imported in each rank as
#: ``__mp_main__``) imports; the forkserver imports them once (:func:`zero_lab.runtime.spawn.start_forkserver`).
RANK_PRELOAD = (__name__, "zero_lab.app.launch.entry")


@dataclass(frozen=True)
class RunSpec:
    """Everything a rank needs, picklable: the resolved config, what it builds and where to write."""

    config: dict[str, Any]
    run_dir: str
    plan: OptimPlan  # the job's one answer to "is this ZeRO, which class steps" (app/plan/optim_plan.py)
    specs: tuple[ParamSpec, ...]  # the job plan's, one per parameter in the optimizer's order (RunPlan.specs)
    meta: dict[str, Any] = field(default_factory=dict)  # choices, git, argv, W&B group/name
    logger_on_rank0: bool = False  # True under torchrun; else the job process follows metrics.jsonl
    never_reached: tuple[str, ...] | None = None  # RunPlan.never_reached: None, it does not apply


@dataclass
class RankResult:
    rank: int
    losses: list[float]
    stopped_by: int = 0  # the signal that stopped the loop early (0: ran every step)


class NonFiniteLoss(FloatingPointError):
    """A rank's loss was NaN or ±Inf: every rank raises it (every rank saw every loss); ``blames_rank``
    names the first rank whose loss was not finite, so the world reports that rank first
    (:mod:`zero_lab.runtime.spawn`), not rank 0 for a NaN that rank 1 produced."""

    def __init__(self, step: int, per_rank: list[RankStep], saved: Path | None):
        culprits = [r for r, s in enumerate(per_rank) if not math.isfinite(s.loss)]
        self.blames_rank = culprits[0] if culprits else None
        bad = ", ".join(f"rank {r}: {per_rank[r].loss}" for r in culprits)
        kept = f"last good checkpoint: {saved}" if saved else "no checkpoint was written before it"
        super().__init__(
            f"non-finite loss at step {step} ({bad}); stopped, {kept}. Lower optim.lr or set optim.max_grad_norm"
        )


def train_rank(spec: RunSpec) -> RankResult:
    """Train on this rank of the current process group; see the module docstring."""
    with StopRequest() as stop:  # SIGTERM/SIGINT from here on: finish the step, checkpoint, leave
        return _train(spec, stop)


def _train(spec: RunSpec, stop: StopRequest) -> RankResult:
    rank, world = dist.get_rank(), dist.get_world_size()
    run_dir = Path(spec.run_dir)
    log_to_file(run_dir, rank)
    cfg = OmegaConf.create(spec.config)
    device = _device(str(cfg.dist.device))
    torch.set_num_threads(cfg.dist.threads_per_rank)
    log.info("rank %d/%d on %s, pid %d, seed %d", rank, world, device, os.getpid(), cfg.seed)

    data = instantiate(cfg.data)
    unused = params_never_reached(spec.never_reached)  # owners balanced over the params with state
    training = build_training(cfg, device, spec.plan, without_grad=unused)
    losses: list[float] = []
    start = 0
    resumed: run_checkpoints.Restored | None = None
    if cfg.resume is not None:
        resumed = run_checkpoints.restore(training, str(cfg.resume), cfg.steps, str(cfg.resume_optimizer))
        start, losses = resumed.step, resumed.losses
        log.info("resumed from %s at step %d (resume_optimizer=%s)", resumed.path, start, cfg.resume_optimizer)
    gather = MetricsGather(device)
    imbalance = training.strategy.imbalance(training.optimizer)
    records: list[dict[str, Any]] = []

    saved = resumed.path if resumed is not None else None  # the last good checkpoint, until this run writes one
    stopped_by = 0
    with ExitStack() as stack:
        sinks = _open_sinks(stack, spec, cfg) if rank == 0 else []
        progress = stack.enter_context(Progress(cfg.steps, start, enabled=rank == 0 and cfg.progress))
        gather.sync()  # rank 0 may have spent time opening sinks; don't bill it to step 0
        batches = batch_stream(data, rank, world, start)
        options = StepOptions.of(cfg)
        for step in range(start, cfg.steps):
            torch.manual_seed(stream_seed(cfg.seed, "rank", rank, "step", step))
            batch = next_batch(batches, rank, step, cfg.steps, _data_option(spec, cfg))
            try:
                measured = measured_step(training, data, batch, options, device)
            except RuntimeError as error:  # DDP's unused-parameter error, in the app's words
                if (explained := unused_parameters(error, training.ddp, step)) is None:
                    raise
                raise explained from error
            measured.stop_signal = stop.signum  # travels with the metrics: every rank sees every request
            per_rank = gather(measured)
            record = step_record(step, per_rank, imbalance, grad_norm=training.max_grad_norm is not None)
            losses.append(record[LOSS.key])
            diverged = not all(math.isfinite(r.loss) for r in per_rank)  # every rank sees every loss: all stop
            if rank == 0 and step == start:  # exchange=auto decides in the first step
                record.update(training.strategy.first_step_record(training.optimizer, EXCHANGE_MODE.key))
            if training.scheduler is not None:
                record[LR.key] = training.scheduler.get_last_lr()[0]  # group 0's, for the next step
            if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
                record[VAL_LOSS.key] = validation_loss(training, data, cfg.eval_batches, options, device, gather.comm)
            if rank == 0:
                records.append(record)
                progress.update(record)
                if diverged or step % cfg.log_every == 0 or step == cfg.steps - 1:
                    for sink in sinks:
                        sink.log(record)
            if diverged:
                raise NonFiniteLoss(step, per_rank, saved)
            last = step + 1 == cfg.steps  # a signal during the last step changes nothing
            stopped_by = 0 if last else next((int(r.stop_signal) for r in per_rank if r.stop_signal), 0)
            if stopped_by or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):  # a stop always saves
                training.strategy.settle(training.optimizer)  # prefetch=true: the exchange still in flight
                saved = run_checkpoints.save(
                    training, run_dir, step + 1, losses, cfg.keep_checkpoints, enum_str(cfg.checkpoint_format)
                )
                log.info("checkpoint %s", saved)
            heartbeat.beat()  # progress, for the job process's stall watch (dist.stall_timeout_s)
            if stopped_by:
                log.warning("%s: stopping after step %d of %d", signal_name(stopped_by), step, cfg.steps)
                break
        training.strategy.settle(training.optimizer)  # before the parameters are read whole
        checksum = agreed_checksum(training.model, gather)
        held = held_anywhere(training, gather)  # every rank: the parameters with state, for "÷ DDP"
        if rank == 0:
            summary = summarize(
                cfg, spec.specs, spec.meta, training, losses, records, checksum, start, held, stopped_by, resumed
            )
            write_json(run_dir / SUMMARY_FILE, summary.as_dict())
            for sink in sinks:
                sink.summary(summary)
    log.info("done: final loss %.6g, param checksum %s", losses[-1], checksum)
    return RankResult(
        rank=rank,
        losses=losses,
        stopped_by=stopped_by,
    )


def _data_option(spec: RunSpec, cfg: DictConfig) -> str:
    """``data=text (zero_lab.app.workloads.data.TextData)``: the data option as a user picked it."""
    choice = spec.meta.get("choices", {}).get("data")
    target = cfg.data.get("_target_")
    return f"data={choice} ({target})" if choice else f"data._target_={target}"


def _open_sinks(stack: ExitStack, spec: RunSpec, cfg: DictConfig) -> list[MetricSink]:
    """metrics.jsonl, plus the configured logger when no job process follows the file
    (torchrun); each is closed (W&B finished) even on errors."""
    sinks: list[MetricSink] = [JsonlSink(Path(spec.run_dir) / METRICS_FILE)]
    if spec.logger_on_rank0:
        sinks.append(make_logger_sink(cfg, spec.run_dir, spec.config, spec.meta, spec.plan))
    for sink in sinks:
        stack.push(lambda exc_type, *_, sink=sink: sink.close(failed=exc_type is not None))
    return sinks


def _device(kind: str) -> torch.device:
    if kind == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")
