"""The Hydra task: start the ranks inside this job, report where it went.

:func:`run` is what ``train.py``'s ``@hydra.main`` calls, once per job (also per job of a ``-m``
sweep, under any launcher), with a config the check callback already checked
(:mod:`zero_lab.app.check.callback`; the task checks only a job no callback of its process saw).
The ranks start here, from this one resolved config, via :func:`zero_lab.runtime.spawn.run_world`
(own rendezvous port per job, so concurrent sweep jobs never collide); under torchrun or ``srun``
with several tasks this process *is* a rank and trains directly.

A sweep job that would train what an earlier, finished job trained is not run again
(:mod:`zero_lab.app.launch.repeats`); a job Slurm requeued resumes from its run dir's checkpoint
(:func:`continue_requeued_run`); a run stopped by a signal hands the signal back to the
handler it replaced (:func:`zero_lab.runtime.signals.hand_back`: under the Slurm launcher,
submitit's, which requeues the job) and otherwise exits non-zero, saying how.

The run dir holds Hydra's ``.hydra/`` and ``train.log``, the files of
:mod:`zero_lab.app.record.run_files`, ``checkpoints/`` and ``wandb/``. :func:`run` returns the
``objective`` read from summary.json (what a sweeper such as Optuna optimises) and prints the
closing lines (:func:`zero_lab.app.record.closing.closing_lines`).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from zero_lab.app.check.before_start import fail
from zero_lab.app.check.callback import check_unless_checked, refuse_bad_dcp_resume
from zero_lab.app.check.notices import notices
from zero_lab.app.check.rules import to_container
from zero_lab.app.config.overrides import read
from zero_lab.app.config.schema import enum_str
from zero_lab.app.launch import repeats
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.record.checkpoint_finder import find_any, step_of_any
from zero_lab.app.record.closing import closing_lines, describe_failure, resume_hint
from zero_lab.app.record.objective import objective_value
from zero_lab.app.record.provenance import run_meta
from zero_lab.app.record.run_files import META_FILE, METRICS_FILE
from zero_lab.app.record.sinks import JsonlFollower, make_logger_sink
from zero_lab.app.record.summary import SUMMARY_FILE, RunSummary
from zero_lab.app.run.rank_loop import RANK_PRELOAD, RankResult, RunSpec, train_rank
from zero_lab.files import write_json
from zero_lab.runtime import external, slurm
from zero_lab.runtime.signals import Stopped, StopStage, hand_back, signal_name, stopping_raises
from zero_lab.runtime.spawn import Interrupted, RankFailure, run_world, start_forkserver

__all__ = ["run"]

log = logging.getLogger("zero_lab.app")
EXIT_RUN_FAILED = 1


Objective = float | list[float]


def run(cfg: DictConfig) -> Objective | None:
    """Train one job; return its ``objective`` value(s) (what sweepers such as Optuna optimise).
    A stop signal outside the ranks' loop (preparing, starting the ranks, finishing) ends it with
    one line that the job's log (``train.log``) keeps too, saying how far it got."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        with stopping_raises("preparing the job", f"{run_dir} holds its config, no step was trained") as stage:
            return _run(cfg, run_dir, stage)
    except Stopped as stopped:
        _log_to_files(str(stopped))
        raise


def _run(cfg: DictConfig, run_dir: Path, stage: StopStage) -> Objective | None:
    hydra_cfg = HydraConfig.get()
    world = external.detect(port=cfg.dist.master_port)
    run_plan = check_unless_checked(cfg, hydra_cfg, world)  # a sweeper's trial, a job a launcher runs elsewhere
    plan = run_plan.optim  # the job's one answer: ZeRO or not, which class steps
    assert plan is not None, "a checked config's optimizer can be looked up"
    overrides = list(hydra_cfg.overrides.task)
    said = notices(cfg, overrides, run_plan)
    config = to_container(cfg)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN and world is None  # under torchrun/srun each rank is a job
    original = _earlier_identical_job(hydra_cfg, config, plan, run_plan.dp.dp, run_dir) if in_sweep else None
    for notice in said if original is None else []:
        _note(notice)
    meta = run_meta(hydra_cfg, OmegaConf.to_container(hydra_cfg.runtime.choices))  # type: ignore[arg-type]
    if world is not None:
        config["dist"]["world_size"] = world.world_size
    continue_requeued_run(config, run_dir, meta, run_plan)
    assert run_plan.specs is not None, "a checked config's model can be built"
    spec = RunSpec(
        config=config,
        run_dir=str(run_dir),
        plan=plan,
        specs=tuple(run_plan.specs),  # the ranks price "÷ DDP" from these: no rank builds a spec
        meta=meta,
        logger_on_rank0=world is not None,
        never_reached=run_plan.never_reached,
    )
    if world is not None:
        return _run_as_external_rank(spec, cfg)
    write_json(run_dir / META_FILE, spec.meta)
    if original is not None:
        return _repeat(original, cfg, plan, run_plan.dp.dp, overrides, run_dir)
    _standard_start_method()
    start_forkserver(*RANK_PRELOAD)  # running already when the check callback started it
    log.info("starting %d %s rank(s) in %s", cfg.dist.world_size, enum_str(cfg.dist.backend), run_dir)
    log.info("data parallel: %s (%s)", run_plan.dp.dp, run_plan.dp.reason)
    stage.now("starting the ranks", f"{run_dir} holds its config, no step was trained")
    started = time.perf_counter()
    make_sink = functools.partial(make_logger_sink, cfg, run_dir, spec.config, spec.meta, plan)
    with JsonlFollower(run_dir / METRICS_FILE, make_sink):  # W&B, from this idle process
        try:
            results = run_world(
                train_rank,
                cfg.dist.world_size,
                (spec,),
                backend=enum_str(cfg.dist.backend),
                timeout_s=cfg.dist.timeout_s,
                start_method="forkserver",
                threads_per_rank=cfg.dist.threads_per_rank,
                stop_grace_s=cfg.dist.stop_grace_s,
                stall_timeout_s=cfg.dist.stall_timeout_s,
            )
        except RankFailure as failure:
            fail(describe_failure(failure, run_dir), EXIT_RUN_FAILED)
        except Interrupted as interrupted:
            _fail_logged(f"{interrupted}; {resume_hint(run_dir, spec.meta)}", 128 + interrupted.signum)
        stage.now("finishing the run", f"every step was trained and saved in {run_dir}")
        # inside the follower: a run stopped by a signal exits here, and W&B records it as failed
        return _report(results, cfg, spec, time.perf_counter() - started)


def continue_requeued_run(config: dict[str, Any], run_dir: Path, meta: dict[str, Any], plan: RunPlan) -> None:
    """In a job Slurm requeued (``SLURM_RESTART_COUNT`` > 0) with no ``resume=`` of its own,
    resume from the newest checkpoint in this run dir, of either format, checked before any rank
    starts as a ``resume=`` run's is (:func:`~zero_lab.app.check.callback.refuse_bad_dcp_resume`: a
    broken DCP checkpoint is one line and exit code 2, not a rank's failure mid-load);
    ``meta["requeued"]`` (summary.json's ``requeued``) records how often and from which step,
    ``None`` on a first start."""
    restarts = slurm.requeue_count(os.environ)
    meta["requeued"] = None
    if not restarts or config.get("resume") is not None:
        return
    found = find_any(run_dir)
    meta["requeued"] = {"restarts": restarts, "from_step": 0, "checkpoint": None}
    if found is None:
        log.warning("requeued (%d) but no checkpoint in %s: starting from step 0", restarts, run_dir)
        return
    refuse_bad_dcp_resume(str(found), enum_str(config.get("resume_optimizer", "strict")), plan)
    config["resume"] = str(run_dir)
    meta["requeued"].update(from_step=step_of_any(found), checkpoint=str(found))
    log.info("requeued (%d): resuming from %s", restarts, found)


def _note(text: str) -> None:
    """Say ``text`` once: ``zero_lab: note: ...`` on stderr, and a WARNING line in the job's log
    files (train.log) without a second copy on the console."""
    print(f"zero_lab: note: {text}", file=sys.stderr, flush=True)
    _log_to_files(text)


def _log_to_files(text: str) -> None:
    """``text`` as a WARNING line in the job's log files (train.log) only, not on the console."""
    record = log.makeRecord(log.name, logging.WARNING, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _fail_logged(text: str, code: int) -> NoReturn:
    """:func:`fail` with ``text``, which the job's log keeps too (how far the run got)."""
    _log_to_files(text)
    fail(text, code)


def _earlier_identical_job(
    hydra_cfg: DictConfig, config: dict[str, Any], plan: OptimPlan, dp: str, run_dir: Path
) -> repeats.Original | None:
    """The earlier job of this sweep that trained what this one would (:mod:`zero_lab.app.launch.repeats`):
    the same config but for keys its optimizer ignores, ``dp`` as ``dp=auto`` resolved."""
    key = repeats.job_key(config, plan.strategy.unused_keys, dp)
    sweep_dir = run_dir
    for _ in Path(str(hydra_cfg.sweep.subdir)).parts:  # the run dir is <sweep dir>/<subdir>, as Hydra made it
        sweep_dir = sweep_dir.parent
    return repeats.claim(sweep_dir, key, run_dir, list(hydra_cfg.overrides.task))


def _repeat(
    original: repeats.Original, cfg: DictConfig, plan: OptimPlan, dp: str, overrides: list[str], run_dir: Path
) -> Objective:
    """This job repeats ``original``: say so in one line, record it, return the earlier job's objective."""
    unused = [o.text for o in read(overrides) if o.root in plan.strategy.unused_keys]
    why = repeats.why_repeat(overrides, original.overrides, unused, cfg.optim._target_, dp)
    repeats.write_repeat(run_dir, original, overrides, unused)
    _note(
        f"{why} this job trains what {original.run_dir} trained; not run again (its results stand for both; "
        f"{run_dir / repeats.REPEAT_FILE})"
    )
    return objective_value(RunSummary.read(original.run_dir / SUMMARY_FILE), cfg.objective)


def _standard_start_method() -> None:
    """Inside a joblib (loky) worker the global start method is "loky", which spawned
    children inherit and cannot resolve ("cannot find context for 'loky'"); reset it."""
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)


def _run_as_external_rank(spec: RunSpec, cfg: DictConfig) -> Objective | None:
    """Under torchrun or srun this process is one rank of the world (joined by the check callback,
    or here under the Slurm launcher); only rank 0 (which wrote summary.json) reports and
    returns the objective."""
    external.join(enum_str(cfg.dist.backend), cfg.dist.timeout_s, cfg.dist.master_port)
    if dist.get_rank() == 0:
        write_json(Path(spec.run_dir) / META_FILE, spec.meta)
    started = time.perf_counter()
    try:
        result = train_rank(spec)
    finally:
        dist.destroy_process_group()
    if result.rank == 0 or result.stopped_by:
        return _report([result], cfg, spec, time.perf_counter() - started)
    return None


def _report(results: list[RankResult], cfg: DictConfig, spec: RunSpec, seconds: float) -> Objective:
    """Print what the run showed and where it went, return its objective; a run stopped by a
    signal exits ``128 + signum`` after saying how far it got and how to continue."""
    run_dir = Path(spec.run_dir)
    if results[0].stopped_by:
        stopped = results[0]
        hand_back(stopped.stopped_by)  # under the Slurm launcher, SIGUSR2: submitit requeues the job and exits
        _fail_logged(  # a stop always saves: the hint names that checkpoint
            f"stopped by {signal_name(stopped.stopped_by)} after {len(stopped.losses)} steps; "
            f"{resume_hint(run_dir, spec.meta)}",
            128 + stopped.stopped_by,
        )
    summary = RunSummary.read(run_dir / SUMMARY_FILE)
    checksum = (summary.param_checksum or "")[:16]
    log.info("finished in %.1f s: final loss %.6g, param checksum %s", seconds, summary.final_loss, checksum)
    value = objective_value(summary, cfg.objective)
    log.info("objective %s = %s", cfg.objective, value)
    print("\n".join(closing_lines(summary, spec.plan.name, run_dir, seconds)), flush=True)
    return value
