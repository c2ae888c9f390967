"""The committed sbatch scripts (``scripts/slurm/*.sbatch``) on the real Slurm cluster
(:mod:`tests.slurm.cluster`), submitted as docs/training.md says, and a submission Slurm
refuses under ``hydra/launcher=slurm``: one line with sbatch's own reason.

- ``srun.sbatch`` and ``torchrun.sbatch``: 2 nodes × 2 ranks each; both train the same 4-rank
  job, so their losses and parameter checksum are identical;
- ``srun.sbatch`` stopped by SIGUSR2 (as at its time limit): the ranks checkpoint and exit 140,
  the script requeues the job, and the requeued job resumes from that checkpoint and finishes.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.runs import REPO, child_env, summary, together
from tests.slurm.cluster import SlurmCluster

SMALL = ("logger=none", "progress=false", "steps=4")
SCRIPTS = REPO / "scripts" / "slurm"


def job_env(run_dir: Path) -> dict[str, str]:
    """The submitting shell: the venv active (its python and torchrun first on PATH), RUN_DIR set."""
    venv_bin = str(Path(sys.executable).parent)
    return child_env() | {"PATH": f"{venv_bin}:{os.environ['PATH']}", "RUN_DIR": str(run_dir)}


def sbatch(slurm: SlurmCluster, script: str, run_dir: Path, *args: str, wait: bool = True):
    """``sbatch [--wait] scripts/slurm/<script> *args`` from the repo root; its log beside the run dir."""
    flags = ["--wait"] if wait else []
    output = f"--output={run_dir.parent}/{run_dir.name}-%j.out"
    argv = ["sbatch", *flags, "--partition=debug", output, str(SCRIPTS / script), *args]
    return slurm.run(argv, cwd=REPO, env=job_env(run_dir), timeout=300)


def test_a_submission_sbatch_refuses_is_one_line_with_its_reason(slurm: SlurmCluster, tmp_path):
    """An unknown partition: sbatch's reason, no submitit traceback, exit 1, nothing queued."""
    argv = [sys.executable, "train.py", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=nope", *SMALL]
    result = slurm.run([*argv, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=REPO, env=child_env(), timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "zero_lab: job(s) #0 not submitted: sbatch refused it: sbatch: error: invalid partition specified: nope; "
        "Batch job submission failed: Invalid partition name specified"
    ]
    assert "Traceback" not in result.stdout + result.stderr and slurm.jobs() == []


@pytest.fixture(scope="module")
def scripts_run(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both scripts submitted as documented, at once (their run dirs)."""
    root = tmp_path_factory.mktemp("sbatch")
    runs = {name: root / name.split(".")[0] for name in ("srun.sbatch", "torchrun.sbatch")}
    done = together(*(functools.partial(sbatch, slurm, name, run_dir, *SMALL) for name, run_dir in runs.items()))
    for (name, run_dir), result in zip(runs.items(), done):
        logs = "".join(p.read_text() for p in root.glob(f"{run_dir.name}-*.out"))
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}{logs[-3000:]}"
    return runs


@pytest.mark.parametrize("script", ["srun.sbatch", "torchrun.sbatch"])
def test_each_committed_script_trains_one_job_over_two_nodes(scripts_run, script):
    run = summary(scripts_run[script])
    assert run["world_size"] == 4 and len(run["losses"]) == 4
    other = summary(scripts_run[({"srun.sbatch", "torchrun.sbatch"} - {script}).pop()])
    assert (run["losses"], run["param_checksum"]) == (other["losses"], other["param_checksum"])
    logs = sorted(p.name for p in (scripts_run[script] / "logs").iterdir())
    assert logs == [f"rank{r}.log" for r in range(4)]


def test_the_srun_script_requeues_at_the_time_limit_and_the_job_resumes(slurm: SlurmCluster, tmp_path):
    """SIGUSR2 to the job's steps (what --signal=USR2@120 sends): checkpoint, exit 140, requeue, resume."""
    run_dir = tmp_path / "limited"
    submitted = sbatch(slurm, "srun.sbatch", run_dir, "logger=none", "progress=false", "steps=400", wait=False)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[-1]  # "Submitted batch job <id>"
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm.run(["scancel", "--signal=USR2", job], timeout=30).returncode == 0
    deadline = time.monotonic() + 400
    while job in slurm.jobs() and time.monotonic() < deadline:
        time.sleep(1)
    assert job not in slurm.jobs(), "the requeued job did not finish in 400 s"
    log = "".join(p.read_text() for p in tmp_path.glob("limited-*.out"))
    run = summary(run_dir)
    assert f"zero_lab: stopped at the time limit; requeueing job {job} to resume in {run_dir}" in log, log[-3000:]
    assert run["requeued"] is not None and run["requeued"]["restarts"] == 1, run
    assert run["requeued"]["from_step"] == run["start_step"] > 0 and len(run["losses"]) == 400  # every step's loss
    assert run["stopped_by"] is None and run["resumed_from"] == str(run_dir)


def _as_in_a_login_session() -> None:
    """SIGHUP at its default (end the process), as in a login shell's command, whatever this test
    runner inherited (under ``nohup`` it is ignored, and the submitter would outlive the hangup)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_a_launcher_sweep_outlives_the_login_session_that_submitted_it(slurm: SlurmCluster, tmp_path):
    """The submitting ``python train.py -m hydra/launcher=slurm`` killed by SIGHUP (the login
    session closing) once its jobs are queued: the jobs run to the end and write their run dirs;
    only the closing lines in that terminal are lost (each job's log has them)."""
    sweep = tmp_path / "sweep"
    argv = [sys.executable, "train.py", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug"]
    command = slurm.command([*argv, "dist.world_size=2", "steps=30", *SMALL[:2], f"hydra.sweep.dir={sweep}"])
    env = {**child_env(), "SLURM_CONF": str(slurm.conf)}
    submitter = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_in_a_login_session,
    )
    try:
        deadline = time.monotonic() + 120
        while not slurm.jobs() and submitter.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slurm.jobs(), "nothing was queued"
        submitter.send_signal(signal.SIGHUP)
        stdout, _ = submitter.communicate(timeout=60)
    finally:
        submitter.kill()
    assert submitter.returncode == -signal.SIGHUP and "run dir:" not in stdout  # the terminal never saw them
    assert slurm.wait_until_no_jobs(timeout_s=300) == []
    run = summary(sweep / "0")
    assert len(run["losses"]) == 30 and run["stopped_by"] is None
    (log,) = (sweep / ".submitit").glob("*/*_0_log.out")
    assert f"  run dir: {sweep / '0'}" in log.read_text()  # where the closing lines went
