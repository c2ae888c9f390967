"""``hydra/launcher=slurm``: Hydra's submitit Slurm launcher, fitted to zero_lab's jobs.

Two modes, chosen by ``hydra.launcher.nodes`` × ``hydra.launcher.tasks_per_node``: **one task
per job** (1 × 1, the default), which starts its ``dist.world_size`` ranks inside, as on a laptop;
**multi-node**, where each job's Slurm tasks *are* its ranks: every task runs the Hydra job, rank
0 claims the job dir and writes ``.hydra/`` and the job log, the others join
(:data:`zero_lab.runtime.external.FOLLOWER_OVERRIDES`). Resources a launcher field leaves ``null``
follow the job (:func:`job_resources`); a job at its time limit checkpoints and is requeued by
submitit, and resumes by itself (:func:`zero_lab.app.launch.task.continue_requeued_run`). The
submitting terminal shows each job's closing lines, or a failed job's error and log; a refused
submission is one line with sbatch's reason (:func:`submission_failure`). docs/training.md#slurm
says it all with the commands.

Hydra loads launchers only from the ``hydra_plugins`` package: ``hydra_plugins/zero_lab_slurm``
defines ``ZeroLabSlurmLauncher``, an empty subclass of :class:`SlurmJobsLauncher`.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, OmegaConf

from zero_lab.app.check.before_start import fail, world_size_given
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.config.schema import enum_str
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.record.closing import FIRST_LINE
from zero_lab.runtime import external

__all__ = ["SlurmJobsLauncher", "closing_block", "job_resources", "sbatch_reason", "submission_failure"]

#: Resident memory of one rank before its model: interpreter, torch, Gloo (a default-job rank peaks at 0.35 GiB).
RANK_BASE_GIB = 0.5
#: The job process of one-task mode: Hydra, the metrics follower, W&B.
JOB_BASE_GIB = 0.5

#: What ``job.results()`` raises for a job that failed: submitit's FailedJobError and
#: UncompletedJobError (RuntimeErrors), a result file that cannot be read or unpickled.
JOB_FAILED = (RuntimeError, OSError, EOFError, pickle.UnpicklingError)


def _tasks(launcher: dict[str, Any]) -> tuple[int, int]:
    return int(launcher.get("nodes") or 1), int(launcher.get("tasks_per_node") or 1)


def job_resources(cfg: DictConfig, launcher: dict[str, Any]) -> dict[str, Any]:
    """``cpus_per_task``, ``gpus_per_node``, ``mem_gb`` for this job: the launcher's values where
    set, else ranks per task × ``dist.threads_per_rank`` CPUs, the ranks per node as GPUs with
    ``dist.device=cuda``, and per node :data:`RANK_BASE_GIB` per rank plus twice what the planner
    prices for plain DDP + the optimizer (ZeRO holds less), plus :data:`JOB_BASE_GIB` for the job
    process in one-task mode."""
    nodes, per_node = _tasks(launcher)
    multi = nodes * per_node > 1
    ranks_per_task = 1 if multi else int(cfg.dist.world_size)
    ranks_per_node = per_node if multi else ranks_per_task
    cuda = enum_str(cfg.dist.device) == "cuda"
    derived: dict[str, Any] = {
        "cpus_per_task": ranks_per_task * int(cfg.dist.threads_per_rank),
        "gpus_per_node": ranks_per_node if cuda else None,
    }
    plain_ddp = None if cuda else RunPlan.of(cfg).memory(None, world_size=1, master_weights=False)  # ZeRO holds less
    host_bytes = 0 if plain_ddp is None else 2 * plain_ddp.ranks[0].total_bytes
    gib = ranks_per_node * (RANK_BASE_GIB + host_bytes / 2**30) + (0 if multi else JOB_BASE_GIB)
    derived["mem_gb"] = max(1, math.ceil(gib))  # Slurm's --mem: per node
    return {key: launcher[key] if launcher.get(key) is not None else value for key, value in derived.items()}


def closing_block(log_text: str) -> list[str]:
    """The last closing block a job printed (:func:`zero_lab.app.record.closing.closing_lines`, and its W&B note)."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(FIRST_LINE)]
    if not starts:
        return []
    first, *rest = lines[starts[-1] :]
    return [first, *itertools.takewhile(lambda line: line.startswith(("  ", "zero_lab: W&B")), rest)]


class SlurmJobsLauncher(SlurmLauncher):
    """Hydra's ``SlurmLauncher`` with zero_lab's modes, resources and closing lines (module docstring)."""

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        """Run the job in this Slurm task; a rank > 0 of a multi-node job writes no ``.hydra/`` or job log."""
        if external.rank() > 0:
            sweep_overrides = [*sweep_overrides, *external.FOLLOWER_OVERRIDES]
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit
        from submitit.core.utils import FailedJobError

        assert self.config is not None and self.hydra_context is not None
        params = dict(self.params)
        executor = submitit.AutoExecutor(
            cluster="slurm", folder=params.pop("submitit_folder"), slurm_max_num_timeout=params.pop("max_num_timeout")
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        groups: dict[tuple[tuple[str, Any], ...], list[int]] = {}
        arguments = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            self._check_world(cfg, list(overrides))
            resources = job_resources(cfg, params)
            groups.setdefault(tuple(sorted(resources.items())), []).append(offset)
            arguments.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
            job = " ".join(filter_overrides(overrides))
            print(f"zero_lab: job #{idx}: {job} -> {_describe(resources)}", flush=True)
        jobs: list[Any] = [None] * len(arguments)
        for key, offsets in groups.items():
            merged = {**params, **dict(key)}
            executor.update_parameters(**{k if k in shared else f"slurm_{k}": v for k, v in merged.items()})
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr, then raises
                    submitted = executor.map_array(self, *zip(*(arguments[o] for o in offsets)))
            except (OSError, FailedJobError) as error:
                done = [job for job in jobs if job is not None]
                fail(submission_failure(error, [initial_job_idx + o for o in offsets], done), code=1)
            for offset, job in zip(offsets, submitted):
                jobs[offset] = job
        return self._collect(jobs, initial_job_idx)

    def _check_world(self, cfg: DictConfig, overrides: list[str]) -> None:
        """Multi-node mode: a ``dist.world_size`` given for the job must equal nodes × tasks_per_node."""
        nodes, per_node = _tasks(self.params)
        ranks = nodes * per_node
        if ranks > 1 and world_size_given(overrides) and int(cfg.dist.world_size) != ranks:
            problem = (
                f"dist.world_size={cfg.dist.world_size}: with hydra.launcher.nodes={nodes} tasks_per_node={per_node} "
                f"every Slurm task is one rank ({ranks} ranks); drop dist.world_size, or set nodes/tasks_per_node "
                "to match"
            )
            fail(ConfigError([problem]))

    @staticmethod
    def _collect(jobs: list[Any], first_idx: int) -> list[JobReturn]:
        """Wait for every job; print its closing lines (or its error and log); raise the first failure."""
        returns: list[JobReturn] = []
        failed: BaseException | None = None
        for offset, job in enumerate(jobs):
            where = f"zero_lab: job #{first_idx + offset} (Slurm job {job.job_id})"
            try:
                returns.append(job.results()[0])
            except JOB_FAILED as error:  # a failed job: say where its log is, then go on to the next one
                last = str(error).strip().splitlines()[-1:] or ["no details"]
                print(f"{where} failed: {last[0]}\n  its log: {job.paths.stdout}", file=sys.stderr, flush=True)
                failed = failed or error
                continue
            block = closing_block(_read(job.paths.stdout))
            print(where + (":" if block else f" finished; its log: {job.paths.stdout}"), flush=True)
            for line in block:
                print(line if line.startswith("  ") else "  " + line.removeprefix("zero_lab: "), flush=True)
        if failed is not None:
            raise failed
        return returns


def sbatch_reason(stderr: str) -> str:
    """sbatch's own reason in one line: its ``fatal:`` line, else its last two ``error:`` lines
    (``sbatch: error: invalid partition specified: gpu; Batch job submission failed: …``)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if "fatal:" in line]
    errors = list(dict.fromkeys(line for line in lines if "error:" in line))  # in order, once each
    if fatal:
        return fatal[-1]
    if errors:
        return "; ".join([errors[-2], errors[-1].split("error:", 1)[1].strip()] if len(errors) > 1 else errors)
    return lines[-1] if lines else "no reason given"


def submission_failure(error: BaseException, indices: Sequence[int], submitted: Sequence[Any]) -> str:
    """The one line for a failed submission of the jobs ``indices``: sbatch's reason (or that
    sbatch is missing) and the jobs already ``submitted`` (they run on; scancel stops them)."""
    numbers = ", ".join(f"#{i}" for i in indices)
    if isinstance(error, FileNotFoundError):
        why = "sbatch not found: hydra/launcher=slurm submits with Slurm's sbatch; run on a Slurm login node"
    elif isinstance(error, OSError):
        why = f"sbatch could not be run ({error})"
    else:
        why = f"sbatch refused it: {sbatch_reason(str(error))}"
    line = f"job(s) {numbers} not submitted: {why}"
    if submitted:
        ids = sorted({str(job.job_id).split("_")[0] for job in submitted})
        line += (
            f"; already submitted and still queued or running: Slurm job(s) {', '.join(ids)} (scancel {' '.join(ids)})"
        )
    return line


def _describe(resources: dict[str, Any]) -> str:
    gpus = f", {resources['gpus_per_node']} GPU(s) per node" if resources.get("gpus_per_node") else ""
    return f"{resources['cpus_per_task']} CPU(s) per task, {resources['mem_gb']} GB{gpus}"


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
