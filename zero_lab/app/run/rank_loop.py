"""The training loop of one rank; the same code under ``run_world`` and under ``torchrun``.

:func:`train_rank` runs inside an initialised process group. Top to bottom:

1. log to ``<run dir>/logs/rank{r}.log``; pick the device (``cuda:LOCAL_RANK`` or CPU);
2. the data; with unused parameters allowed, the parameters that never get a gradient (the job
   plan's, :func:`zero_lab.app.run.grad_reach.params_never_reached`), so the ZeRO owners are
   balanced over the others from construction; then model -> DDP -> optimizer
   (:func:`zero_lab.app.run.build.build_training`);
3. with ``resume=``, load the checkpoint on every rank (any world size, either format);
4. each step: reseed from ``(seed, rank, step)`` (so a resumed run draws what the
   uninterrupted one drew), take this rank's batch (:func:`zero_lab.app.workloads.protocols.batch_stream`:
   its slice of the global batch, or its next batch of a stream sharded by rank), forward,
   backward (DDP all-reduces gradients), ``optimizer.step()`` (ZeRO: local step +
   parameter exchange), then one all-gather of every rank's measurements;
5. a NaN/Inf loss on any rank stops every rank in that step (:class:`NonFiniteLoss`,
   before any checkpoint of the diverged state); every ``checkpoint_every`` steps, save
   atomically (:mod:`zero_lab.app.run.checkpoints`: each rank its shard for ZeRO, rank 0 the
   full state for plain optimizers), keeping the ``keep_checkpoints`` newest;
   after a SIGTERM/SIGINT/SIGUSR2 on any rank (:mod:`zero_lab.runtime.signals`), every rank
   finishes the step, saves (whatever ``checkpoint_every`` says: a requeued job resumes
   from it) and leaves the loop in the same step;
6. at the end, hash the parameters on every rank and check all ranks agree, then rank 0
   writes ``summary.json`` (its "÷ DDP" baseline priced from the job plan's specs, over the
   parameters some rank holds state for).

Only rank 0 writes shared files (``metrics.jsonl``, ``summary.json``, the model and the
checkpoint manifest); ZeRO checkpoints get one optimizer-shard file per rank.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import statistics
import time
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
from zero_lab.app.plan.run_plan import shard_size_of
from zero_lab.app.record.metrics import (
    MetricsGather,
    RankStep,
    local_step_summary,
    peak_memory_bytes,
    phase_summary,
    step_record,
)
from zero_lab.app.record.progress import Progress
from zero_lab.app.record.run_files import LOGS_DIR, METRICS_FILE
from zero_lab.app.record.sinks import JsonlSink, MetricSink, make_logger_sink
from zero_lab.app.record.summary import MEDIAN_OF, NAMESPACED, PROVENANCE, SUMMARY_FILE, RunSummary, step_key
from zero_lab.app.run import checkpoints as run_checkpoints
from zero_lab.app.run.build import build_training
from zero_lab.app.run.grad_reach import params_never_reached
from zero_lab.app.run.memory import (
    ddp_state_bytes,
    master_weight_bytes,
    optimizer_classes,
    params_with_state,
    training_tensor_bytes,
)
from zero_lab.app.run.rank_errors import next_batch, unused_parameters
from zero_lab.app.run.step import StepOptions, apply_step, forward_backward, unscale_and_clip, validation_loss
from zero_lab.app.run.training import Training
from zero_lab.app.workloads.data import stream_seed
from zero_lab.app.workloads.protocols import Batch, batch_rows, batch_stream
from zero_lab.comm import INTER_GROUP, INTER_NODE
from zero_lab.elementwise import is_elementwise
from zero_lab.files import write_json
from zero_lab.grad_reduce import held_grad_bytes
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import ParamSpec
from zero_lab.runtime import heartbeat
from zero_lab.runtime.signals import StopRequest, signal_name

__all__ = ["RANK_PRELOAD", "NonFiniteLoss", "RankResult", "RunSpec", "train_rank"]

log = logging.getLogger("zero_lab.app")

#: What a rank imports: this module, and the entry point that ``train.py`` (re-imported in each
#: rank as ``__mp_main__``) imports. The forkserver the ranks fork from imports them once
#: (:func:`zero_lab.runtime.spawn.start_forkserver`).
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
    param_checksum: str
    log_path: str
    stopped_by: int = 0  # the signal that stopped the loop early (0: ran every step)
    checkpoint: str | None = None  # the last checkpoint this run wrote


class NonFiniteLoss(FloatingPointError):
    """A rank's loss was NaN or ±Inf: the run stops (no checkpoint of the diverged state).

    Every rank raises it (every rank saw every loss); ``blames_rank`` names the first rank whose
    loss was not finite, so the world reports that rank first (:mod:`zero_lab.runtime.spawn`),
    not rank 0 for a NaN that rank 1 produced."""

    def __init__(self, step: int, per_rank: list[RankStep], saved: Path | None):
        culprits = [r for r, s in enumerate(per_rank) if not math.isfinite(s.loss)]
        self.blames_rank = culprits[0] if culprits else None
        bad = ", ".join(f"rank {r}: {per_rank[r].loss}" for r in culprits)
        kept = f"last good checkpoint: {saved}" if saved else "no checkpoint was written (checkpoint_every=0)"
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
    log_path = _log_to_file(run_dir, rank)
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

    saved: Path | None = None
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
                measured = _train_step(training, data, batch, options, device)
            except RuntimeError as error:  # DDP's unused-parameter error, in the app's words
                if (explained := unused_parameters(error, training.ddp, step)) is None:
                    raise
                raise explained from error
            measured.stop_signal = stop.signum  # travels with the metrics: every rank sees every request
            per_rank = gather(measured)
            record = step_record(step, per_rank, imbalance, grad_norm=training.max_grad_norm is not None)
            losses.append(record["train/loss"])
            diverged = not all(math.isfinite(r.loss) for r in per_rank)  # every rank sees every loss: all stop
            if rank == 0 and step == start:  # exchange=auto decides in the first step
                record.update(training.strategy.first_step_record(training.optimizer, NAMESPACED))
            if training.scheduler is not None:
                record["train/lr"] = training.scheduler.get_last_lr()[0]  # group 0's, for the next step
            if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
                val = validation_loss(training, data, rank, world, cfg.eval_batches, options, device, gather.comm)
                record["val/loss"] = val
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
            if _checkpoint_due(cfg.checkpoint_every, step, stopped_by):
                _settle(training)
                saved = run_checkpoints.save(
                    training, run_dir, step + 1, losses, cfg.keep_checkpoints, enum_str(cfg.checkpoint_format)
                )
                log.info("checkpoint %s", saved)
            heartbeat.beat()  # progress, for the job process's stall watch (dist.stall_timeout_s)
            if stopped_by:
                log.warning("%s: stopping after step %d of %d", signal_name(stopped_by), step, cfg.steps)
                break
        _settle(training)
        checksum = _agreed_checksum(training.model, gather)
        held = _held_anywhere(training, gather)  # every rank: the parameters with state, for "÷ DDP"
        if rank == 0:
            summary = _summary(cfg, spec, training, losses, records, checksum, start, held)
            summary.stopped_by = signal_name(stopped_by) if stopped_by else None
            if resumed is not None:
                summary.resume_optimizer = str(cfg.resume_optimizer)
                summary.resume_overridden = resumed.overridden
                summary.resumed_checkpoint = str(resumed.path)
            write_json(run_dir / SUMMARY_FILE, summary.as_dict())
            for sink in sinks:
                sink.summary(summary)
    log.info("done: final loss %.6g, param checksum %s", losses[-1], checksum)
    return RankResult(
        rank=rank,
        losses=losses,
        param_checksum=checksum,
        log_path=str(log_path),
        stopped_by=stopped_by,
        checkpoint=str(saved) if saved is not None else None,
    )


def _data_option(spec: RunSpec, cfg: DictConfig) -> str:
    """``data=text (zero_lab.app.workloads.data.TextData)``: the data option as a user picked it."""
    choice = spec.meta.get("choices", {}).get("data")
    target = cfg.data.get("_target_")
    return f"data={choice} ({target})" if choice else f"data._target_={target}"


def _checkpoint_due(every: int, step: int, stopped_by: int) -> bool:
    """Save after ``step``: every ``every`` steps, and always when a signal stops the run."""
    return bool(stopped_by) or bool(every and (step + 1) % every == 0)


def _train_step(training: Training, data: Any, batch: Batch, options: StepOptions, device: torch.device) -> RankStep:
    """One optimizer step on this rank's batch (:mod:`zero_lab.app.run.step`); returns what it measured."""
    comm = training.exchange_stats
    before = comm.snapshot() if comm is not None else None
    reducer = training.grad_reducer
    grads = reducer.stats if reducer is not None else None
    grads_before = grads.snapshot() if grads is not None else None
    exposed_before = reducer.exposed_seconds if reducer is not None else 0.0
    local_before = training.step_clock.seconds()
    start = time.perf_counter()
    training.optimizer.zero_grad(set_to_none=True)
    loss = forward_backward(training, data, batch, options, device)  # DDP all-reduces in the last backward
    grad_bytes = held_grad_bytes(list(training.model.parameters()), reducer)  # + DDP's buckets, with grad_reduce=
    grad_norm = unscale_and_clip(training)  # optim.max_grad_norm: the global norm, before any shard steps
    if grad_norm is not None and comm is not None:
        before = comm.snapshot()  # the norm's all-reduce is not exchange (clipping rules out overlap)
    apply_step(training)  # ZeRO: step own shards, then exchange parameters; then the LR scheduler
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    exchange = comm.since(before) if comm is not None and before is not None else None
    reduced = grads.since(grads_before) if grads is not None and grads_before is not None else None
    return RankStep(
        loss=loss.item(),
        step_s=elapsed,
        exchange_s=exchange.seconds if exchange else 0.0,
        exchange_exposed_s=exchange.exposed_seconds if exchange else 0.0,
        exchange_bytes=exchange.bytes if exchange else 0.0,
        exchange_calls=exchange.calls if exchange else 0.0,
        optim_state_bytes=optimizer_state_bytes(training.optimizer),
        master_weight_bytes=master_weight_bytes(training.optimizer),
        tensor_bytes=training_tensor_bytes(training),
        peak_bytes=peak_memory_bytes(device),
        samples=batch_rows(batch[0]),
        grad_norm=grad_norm if grad_norm is not None else 0.0,
        optim_step_s=training.step_clock.seconds() - local_before,
        grad_reduce_bytes=reduced.sent_bytes if reduced else 0.0,
        exchange_sent_bytes=exchange.sent_bytes if exchange else 0.0,
        grad_reduce_s=reduced.seconds if reduced else 0.0,
        grad_reduce_exposed_s=reducer.exposed_seconds - exposed_before if reducer is not None else 0.0,
        grad_bytes=grad_bytes,
        grad_reduce_inter_group_bytes=reduced.sent_by_link.get(INTER_GROUP, 0) if reduced else 0.0,
        grad_reduce_inter_node_bytes=reduced.sent_by_link.get(INTER_NODE, 0) if reduced else 0.0,
        exchange_inter_group_bytes=exchange.sent_by_link.get(INTER_GROUP, 0) if exchange else 0.0,
        exchange_inter_node_bytes=exchange.sent_by_link.get(INTER_NODE, 0) if exchange else 0.0,
    )


def _settle(training: Training) -> None:
    """Finish a parameter exchange still in flight (``prefetch=true`` leaves the last step's to
    the next forward) before the parameters are read whole: a checkpoint, the final checksum."""
    training.strategy.settle(training.optimizer)


def _open_sinks(stack: ExitStack, spec: RunSpec, cfg: DictConfig) -> list[MetricSink]:
    """metrics.jsonl, plus the configured logger when no job process follows the file
    (torchrun); each is closed (W&B finished) even on errors."""
    sinks: list[MetricSink] = [JsonlSink(Path(spec.run_dir) / METRICS_FILE)]
    if spec.logger_on_rank0:
        sinks.append(make_logger_sink(cfg, spec.run_dir, spec.config, spec.meta, spec.plan))
    for sink in sinks:
        stack.push(lambda exc_type, *_, sink=sink: sink.close(failed=exc_type is not None))
    return sinks


def param_checksum(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter's name, shape, dtype and bytes, in registration order."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _agreed_checksum(model: torch.nn.Module, gather: MetricsGather) -> str:
    """Every rank hashes its replica; all-gather the hashes and fail if any rank differs."""
    mine = param_checksum(model)
    words = torch.tensor(
        [int.from_bytes(bytes.fromhex(mine)[i : i + 8], "little", signed=True) for i in range(0, 32, 8)],
        dtype=torch.int64,
        device=gather.device,
    )
    everyone = torch.zeros(4 * gather.world_size, dtype=torch.int64, device=gather.device)
    gather.comm.all_gather_into(everyone, words, op="checksum")
    rows = everyone.view(gather.world_size, 4).cpu().tolist()
    differing = [r for r, row in enumerate(rows) if row != rows[0]]
    if differing:
        raise RuntimeError(f"replicas diverged: ranks {differing} hold different parameters than rank 0")
    return mine


def _held_anywhere(training: Training, gather: MetricsGather) -> list[bool]:
    """Per parameter of the optimizer's param groups: whether any rank holds state for it
    (:func:`~zero_lab.app.run.memory.params_with_state`, a MAX all-reduce under the dist timeout)."""
    mine = torch.tensor(params_with_state(training.optimizer), dtype=torch.float32, device=gather.device)
    gather.comm.all_reduce(mine, dist.ReduceOp.MAX, op="state_mask")
    return [bool(flag) for flag in mine.cpu().tolist()]


def _summary(
    cfg: DictConfig,
    spec: RunSpec,
    training: Training,
    losses: list[float],
    records: list[dict[str, Any]],
    checksum: str,
    start: int,
    held: list[bool] | None = None,
) -> RunSummary:
    """summary.json (:class:`~zero_lab.app.record.summary.RunSummary`): the contract scripts and dashboards read."""
    world = dist.get_world_size()
    timed = records[1:] or records  # the first step pays one-off allocation costs
    last = records[-1] if records else {}

    def per_rank(measurement: str) -> list[float]:
        return [last.get(step_key(measurement, f"rank{r}"), 0.0) for r in range(world)]

    def median(key: str) -> float | None:
        return statistics.median(r[key] for r in timed) if timed else None

    optim_state = per_rank("optim_state_bytes")
    planned = ddp_state_bytes(spec.specs, training.optimizer, held)  # planned, for "÷ DDP": like with like
    classes = optimizer_classes(training.optimizer)
    evaluated = [r["val/loss"] for r in records if "val/loss" in r]
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
        master_weight_bytes=per_rank("master_weight_bytes"),
        tensor_bytes=per_rank("tensor_bytes"),
        peak_bytes=per_rank("peak_bytes"),
        ddp_state_bytes=planned,
        optimizer_classes=[cls.__name__ for cls in classes],
        elementwise=all(is_elementwise(cls) for cls in classes),
        imbalance=last.get(NAMESPACED["imbalance"], 1.0),
        **{name: median(key) for name, key in MEDIAN_OF.items()},  # step_time_s, exchange_time_s, ...
        final_val_loss=evaluated[-1] if evaluated else None,
        best_val_loss=min(evaluated) if evaluated else None,
        accumulate=cfg.get("accumulate", 1),
        eval_every=int(cfg.get("eval_every") or 0),
        eval_batches=cfg.get("eval_batches") if cfg.get("eval_every") else None,
        autocast=str(cfg.get("autocast")) if cfg.get("autocast") is not None else None,
        compile=bool(cfg.get("compile", False)),
        compiled_graphs=_compiled_graphs() if cfg.get("compile") else None,
        **local_step_summary(timed, world),  # time/optim_step_s: per-rank medians, slowest ÷ mean
        state_vs_ddp=max(optim_state) / planned if planned else None,
        partition=training.strategy.partition_report(training.optimizer),
        shard_size=shard_size_of(cfg),
        provenance={k: v for k, v in spec.meta.items() if k in PROVENANCE},
        **phase_summary(training, timed, world),
    )


def _compiled_graphs() -> int:
    """How many graphs ``torch.compile`` made on this rank (1 + graph breaks + recompiles)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _device(kind: str) -> torch.device:
    if kind == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _log_to_file(run_dir: Path, rank: int) -> Path:
    """Send the ``zero_lab`` loggers of this process to ``<run dir>/logs/rank{r}.log``."""
    path = run_dir / LOGS_DIR / f"rank{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger("zero_lab")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    _enable_zero_lab_loggers()
    return path


def _enable_zero_lab_loggers() -> None:
    """Undo Hydra's ``disable_existing_loggers: true`` for zero_lab's own loggers: under torchrun
    or srun, ranks > 0 configure Hydra's logging as disabled, which would leave their rank log empty."""
    for name, logger in logging.Logger.manager.loggerDict.items():
        if (name == "zero_lab" or name.startswith("zero_lab.")) and isinstance(logger, logging.Logger):
            logger.disabled = False
