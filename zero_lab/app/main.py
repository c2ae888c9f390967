"""The Hydra task: check the config, start the ranks inside this job, report where it went.

:func:`run` is what ``train.py``'s ``@hydra.main`` calls, once per job (also per job of a
``-m`` sweep, under any launcher). The ranks start here, from this one resolved config,
via :func:`zero_lab.runtime.launch.run_world` (own rendezvous port per job, so concurrent sweep
jobs never collide); under torchrun or ``srun`` with several tasks (also ``hydra/launcher=slurm``
with ``nodes``/``tasks_per_node`` > 1) this process *is* a rank and trains directly.

A job Slurm requeued (its time limit, a pre-emption) continues from the checkpoint its last
attempt saved in its run dir (:func:`continue_requeued_run`); a run stopped by a signal hands
the signal back to the handler it replaced (:func:`zero_lab.runtime.signals.hand_back`: under
the Slurm launcher, submitit's, which requeues the job) and otherwise exits non-zero.

The run dir (Hydra's output dir) then holds::

    .hydra/            resolved config, overrides (Hydra)
    train.log          this job's log (Hydra)
    meta.json          git revision, command line, group choices, seeds
    logs/rank{r}.log   one log per rank (+ rank{r}.error.txt if it failed)
    metrics.jsonl      one JSON object per logged step (rank 0)
    summary.json       written at the end (rank 0)
    checkpoints/       with checkpoint_every=K
    wandb/             with logger=wandb

:func:`run` returns the ``objective`` (:mod:`zero_lab.app.objective`) read from summary.json,
which is what a sweeper such as Optuna optimises, and ends with a few lines that show what
ZeRO saved (:func:`zero_lab.app.closing.closing_lines`): final loss, optimizer state per rank against what the
plain optimizer would hold (the planner's prediction), the exchange's share of the step.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from zero_lab.app.build import enum_str
from zero_lab.app.cli import check_external_world, fail
from zero_lab.app.closing import closing_lines
from zero_lab.app.objective import check_directions, objective_value
from zero_lab.app.optim_plan import OptimPlan
from zero_lab.app.paths import SOURCE_DIR
from zero_lab.app.runner import RankResult, RunSpec, train_rank
from zero_lab.app.sinks import JsonlFollower, make_logger_sink
from zero_lab.app.summary import SUMMARY_FILE, RunSummary
from zero_lab.app.validate import ConfigError, check, notices, to_container, was_checked
from zero_lab.checkpoint import checkpoint_step, find_checkpoint
from zero_lab.files import write_atomic, write_json
from zero_lab.runtime import external, slurm
from zero_lab.runtime.launch import Interrupted, RankFailure, RankStalled, describe_exit, last_line, run_world
from zero_lab.runtime.signals import hand_back, signal_name

__all__ = ["run"]

log = logging.getLogger("zero_lab.app")
EXIT_RUN_FAILED = 1


Objective = float | list[float]


def run(cfg: DictConfig) -> Objective | None:
    """Train one job; return its ``objective`` value(s) (what sweepers such as Optuna optimise)."""
    hydra_cfg = HydraConfig.get()
    choices = OmegaConf.to_container(hydra_cfg.runtime.choices)
    if not was_checked(cfg):  # a job the preflight could not expand (an Optuna sweep), or started without train.py
        try:
            check(cfg, choices)
        except ConfigError as error:
            fail(error)
    directions = hydra_cfg.sweeper.get("direction")  # Optuna's; other sweepers have none
    if directions is not None and (problems := check_directions(cfg.objective, directions)):
        fail(ConfigError(problems))
    for notice in notices(cfg, list(hydra_cfg.overrides.task)):
        log.warning(notice)
        print(f"zero_lab: note: {notice}", file=sys.stderr, flush=True)
    run_dir = Path(hydra_cfg.runtime.output_dir)
    world = external.detect(port=cfg.dist.master_port)
    if world is not None:  # under the Slurm launcher's multi-node mode, cli.prepare did not run in this task
        try:
            check_external_world(cfg, list(hydra_cfg.overrides.task), False, world)
        except ConfigError as error:
            fail(error)
    config, meta = to_container(cfg), run_meta(hydra_cfg, choices)
    if world is not None:
        config["dist"]["world_size"] = world.world_size
    continue_requeued_run(config, run_dir, meta)
    spec = RunSpec(config=config, run_dir=str(run_dir), meta=meta, logger_on_rank0=world is not None)
    if world is not None:
        return _run_as_external_rank(spec, cfg)
    write_json(run_dir / "meta.json", spec.meta)
    _standard_start_method()
    log.info("starting %d %s rank(s) in %s", cfg.dist.world_size, enum_str(cfg.dist.backend), run_dir)
    started = time.perf_counter()
    make_sink = functools.partial(make_logger_sink, cfg, run_dir, spec.config, spec.meta)
    with JsonlFollower(run_dir / "metrics.jsonl", make_sink):  # W&B, from this idle process
        try:
            results = run_world(
                train_rank,
                cfg.dist.world_size,
                (spec,),
                backend=enum_str(cfg.dist.backend),
                timeout_s=cfg.dist.timeout_s,
                start_method="spawn",
                threads_per_rank=cfg.dist.threads_per_rank,
                stop_grace_s=cfg.dist.stop_grace_s,
                stall_timeout_s=cfg.dist.stall_timeout_s,
            )
        except RankFailure as failure:
            fail(_describe_failure(failure, run_dir), EXIT_RUN_FAILED)
        except Interrupted as interrupted:
            fail(f"{interrupted}; {_resume_hint(run_dir, spec.meta)}", 128 + interrupted.signum)
        # inside the follower: a run stopped by a signal exits here, and W&B records it as failed
        return _report(results, cfg, run_dir, time.perf_counter() - started, spec.meta)


def _standard_start_method() -> None:
    """Inside a joblib (loky) worker the global start method is "loky", which spawned
    children inherit and cannot resolve ("cannot find context for 'loky'"); reset it."""
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)


def continue_requeued_run(config: dict[str, Any], run_dir: Path, meta: dict[str, Any]) -> None:
    """In a job Slurm requeued (``SLURM_RESTART_COUNT`` > 0) with no ``resume=`` of its own,
    resume from the newest checkpoint in this run dir; ``meta["requeued"]`` (summary.json's
    ``requeued``) records how often and from which step, ``None`` on a first start."""
    restarts = slurm.requeue_count(os.environ)
    meta["requeued"] = None
    if not restarts or config.get("resume") is not None:
        return
    found = find_checkpoint(run_dir)
    meta["requeued"] = {"restarts": restarts, "from_step": 0, "checkpoint": None}
    if found is None:
        log.warning("requeued (%d) but no checkpoint in %s: starting from step 0", restarts, run_dir)
        return
    config["resume"] = str(run_dir)
    meta["requeued"].update(from_step=checkpoint_step(found), checkpoint=str(found))
    log.info("requeued (%d): resuming from %s", restarts, found)


def _run_as_external_rank(spec: RunSpec, cfg: DictConfig) -> Objective | None:
    """Under torchrun or srun this process is one rank of the world (joined by ``cli.prepare``,
    or here under the Slurm launcher); only rank 0 (which wrote summary.json) reports and
    returns the objective."""
    external.join(enum_str(cfg.dist.backend), cfg.dist.timeout_s, cfg.dist.master_port)
    if dist.get_rank() == 0:
        write_json(Path(spec.run_dir) / "meta.json", spec.meta)
    started = time.perf_counter()
    try:
        result = train_rank(spec)
    finally:
        dist.destroy_process_group()
    if result.rank == 0 or result.stopped_by:
        return _report([result], cfg, Path(spec.run_dir), time.perf_counter() - started, spec.meta)
    return None


def _report(
    results: list[RankResult], cfg: DictConfig, run_dir: Path, seconds: float, meta: dict[str, Any]
) -> Objective:
    """Print what the run showed and where it went, return its objective; a run stopped by a
    signal exits ``128 + signum`` after saying how far it got and how to continue."""
    if results[0].stopped_by:
        stopped = results[0]
        hand_back(stopped.stopped_by)  # under the Slurm launcher, SIGUSR2: submitit requeues the job and exits
        saved = f"checkpoint {stopped.checkpoint}" if stopped.checkpoint else "no checkpoint (checkpoint_every=0)"
        fail(
            f"stopped by {signal_name(stopped.stopped_by)} after {len(stopped.losses)} steps; {saved}; "
            f"{_resume_hint(run_dir, meta)}",
            128 + stopped.stopped_by,
        )
    summary = RunSummary.read(run_dir / SUMMARY_FILE)
    log.info(
        "finished in %.1f s: final loss %.6g, param checksum %s",
        seconds,
        summary.final_loss,
        (summary.param_checksum or "")[:16],
    )
    value = objective_value(summary, cfg.objective)
    log.info("objective %s = %s", cfg.objective, value)
    print("\n".join(closing_lines(summary, OptimPlan.of(cfg.optim).name, run_dir, seconds)), flush=True)
    return value


def _resume_hint(run_dir: Path, meta: dict[str, Any]) -> str:
    """``continue with: python train.py <the same overrides> resume=<run dir>``, shell-quoted
    so it can be pasted as is (paths with spaces, overrides with brackets), the path also
    quoted for Hydra's override parser where it would read it otherwise (a comma: a sweep)."""
    found = find_checkpoint(run_dir)
    if found is None:
        return "no complete checkpoint to resume from"
    kept = [o for o in meta.get("overrides", []) if not o.startswith(("resume=", "hydra."))]
    return "continue with: " + shlex.join(["python", "train.py", *kept, f"resume={hydra_quoted(str(run_dir))}"])


_HYDRA_PLAIN = re.compile(r"[\w./:@%+~-]+")


def hydra_quoted(value: str) -> str:
    """``value`` as a Hydra override value that parses back to itself: as is when plain,
    else single-quoted (``'/runs/a,b'``; a quote inside escaped as ``\\'``)."""
    return value if _HYDRA_PLAIN.fullmatch(value) else "'" + value.replace("'", "\\'") + "'"


def _describe_failure(failure: RankFailure, run_dir: Path) -> str:
    """Which rank failed and how (its error's own message, first line — or the signal / exit
    code it died of, or how it stalled), where its log is, and its full traceback saved in
    the run dir."""
    path = run_dir / "logs" / f"rank{failure.rank}.error.txt"
    write_atomic(path, lambda f: f.write(failure.details.encode("utf-8")))
    if failure.exitcode is not None:
        what = (
            f"its process was {describe_exit(failure.exitcode)}"
            if failure.exitcode < 0
            else (f"its process ended with {describe_exit(failure.exitcode)} before reporting")
        )
    else:
        what = failure.summary
    if isinstance(failure, RankStalled):  # the others' /proc states, or the peer that waited
        echoes = "".join(f"\n  (rank {r}: {last_line(d)[:200]})" for r, d in sorted(failure.others.items()))
    else:
        echoes = "".join(f"\n  (rank {r} {_echo(d, failure.details)})" for r, d in sorted(failure.others.items()))
    log_path = run_dir / "logs" / f"rank{failure.rank}.log"
    verb = "stalled" if isinstance(failure, RankStalled) else "failed"
    what = what.removeprefix("stalled: ")
    return f"rank {failure.rank} {verb}: {what}\n  its log: {log_path}\n  full traceback: {path}{echoes}"


def _echo(details: str, first: str) -> str:
    """Another rank's failure beside the first: the same error (a checkpoint every rank
    refused), or what it failed of after it (often only the first one's echo)."""
    line = last_line(details)
    return "failed too, with the same error" if line == last_line(first) else f"failed after it: {line[:200]}"


def run_meta(hydra_cfg: Any, choices: dict[str, Any]) -> dict[str, Any]:
    """What reproduces this job: command, overrides, choices, git revision, host; W&B group/name."""
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    meta: dict[str, Any] = {
        "command": shlex.join(["python", "train.py", *overrides]),  # pasteable as is
        "argv": list(sys.argv),
        "overrides": overrides,
        "choices": {k: v for k, v in choices.items() if not str(k).startswith(("hydra/", "schema/"))},
        "git": git_revision(),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "seeds": "model init: seed; step s on rank r: stream_seed(seed, 'rank', r, 'step', s); data: (seed, step)",
        "multirun": multirun,
        "group": None,
        "name": None,
    }
    if multirun:
        sweep_dir = Path(str(hydra_cfg.sweep.dir))
        meta["group"] = "sweep-" + "_".join(sweep_dir.parts[-2:])
        meta["name"] = hydra_cfg.job.override_dirname or f"job{hydra_cfg.job.num}"
        meta["job_num"] = hydra_cfg.job.num
    return meta


def git_revision() -> dict[str, Any]:
    """HEAD of the project's git checkout and whether the tree had local changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(SOURCE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "-C", str(SOURCE_DIR), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {"rev": None, "dirty": None}
    if head.returncode != 0:
        return {"rev": None, "dirty": None}
    return {"rev": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
