"""``train.py`` on a real Slurm cluster (:mod:`tests.slurm.cluster`): the commands docs/training.md shows.

- one node: ``-m hydra/launcher=slurm`` runs a 2-job sweep as job arrays (W=2 and W=4, each
  job's ranks spawned inside its one task); its runs are the single-node references;
- two nodes, one job, 1 and 2 ranks per node, three ways: the launcher's multi-node mode,
  ``srun python train.py``, ``srun torchrun`` in an sbatch script — losses and parameter
  checksum bit-identical to the single-node run of the same world size; a mismatched
  ``dist.world_size`` under srun is refused once, with the fix;
- a job reaching its time limit: SIGUSR2 before it, checkpoint, requeue, resume by itself,
  and the final loss of an uninterrupted run (its first attempt held slow until the test sees
  the requeue, so the signal finds it training however fast the machine is).

Runs that do not depend on each other are made together (:func:`tests.e2e.runs.together`).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.runs import REPO, TORCHRUN, assert_no_leftover_processes, child_env, summary, together
from tests.slurm.cluster import SlurmCluster
from tests.slurm.gated_data import GATE, GatedRegression

SMALL = ("logger=none", "progress=false", "steps=4")


def train(
    slurm: SlurmCluster,
    *args: str,
    launcher: tuple[str, ...] = (),
    timeout: float = 240,
    env: dict[str, str] | None = None,
):
    """``[launcher] python train.py *args`` on the login node, from the repo root (``env``: the
    environment, the tests' own by default)."""
    return slurm.run([*launcher, sys.executable, "train.py", *args], cwd=REPO, env=env or child_env(), timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


@pytest.fixture(scope="module")
def single_node(two_nodes: dict[str, Any]) -> tuple[Path, str]:
    """The documented launcher command as a 2-job sweep (W=2, W=4; made with the multi-node
    runs, at the same time): (sweep dir, its stdout)."""
    return two_nodes["root"] / "single", ok(two_nodes["single"]).stdout


def test_the_launcher_runs_a_sweep_on_one_node_and_prints_each_jobs_closing_lines(single_node):
    sweep, stdout = single_node
    for job, world in ((0, 2), (1, 4)):
        assert summary(sweep / str(job))["world_size"] == world
        assert f"  run dir: {sweep / str(job)}" in stdout
        assert f"  final loss {summary(sweep / str(job))['final_loss']:.6g} after 4 steps on {world} rank(s)" in stdout
    assert stdout.count("zero_lab: job #") == 4  # two "-> resources" lines at submission, two closing blocks
    # resources follow the job: one CPU per rank, memory from the planner (not 16 GB), two arrays
    scripts = sorted((sweep / ".submitit").glob("*/*_submission.sh"))
    asked = sorted(
        [line.split("=")[1] for line in p.read_text().splitlines() if "--cpus-per-task" in line or "--mem" in line]
        for p in scripts
    )
    assert asked == [["2", "2GB"], ["4", "3GB"]], asked


def _sbatch_torchrun(root: Path, per_node: int) -> Path:
    """An sbatch script: one torchrun per node (srun), 2 nodes, rendezvous at the first node.

    Static rendezvous (``--node_rank``): with ``--rdzv_backend c10d`` the agent that hosts the
    store may exit first, and the other then fails polling it (exit 1 after training, under load)."""
    script = root / f"torchrun_{per_node}.sh"
    script.write_text(
        f"""#!/bin/sh
#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task={per_node} --output={root}/torchrun_{per_node}.out
export HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun sh -c 'exec {TORCHRUN} --nnodes 2 --nproc_per_node {per_node} --node_rank "$SLURM_NODEID" \\
    --master_addr "$HEAD" --master_port $((20000 + SLURM_JOB_ID % 10000)) \\
    train.py {" ".join(SMALL)} hydra.run.dir={root}/torchrun_{per_node}'
"""
    )
    return script


def _srun_stopped_by_sigusr2(slurm: SlurmCluster, run_dir: Path) -> subprocess.CompletedProcess[str]:
    """``srun -N2 -n2 python train.py`` of a long run, sent SIGUSR2 (as at a time limit) once it trains."""
    argv = ["srun", "--job-name=zl-usr2", "-N2", "-n2", sys.executable, "train.py", *SMALL[:2], "steps=100000"]
    proc = subprocess.Popen(
        slurm.command([*argv, f"hydra.run.dir={run_dir}"]),
        cwd=REPO,
        env={**child_env(), "SLURM_CONF": str(slurm.conf)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "metrics.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        slurm.run(["scancel", "--signal=USR2", "--name=zl-usr2"], timeout=30)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def two_nodes(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every multi-node way at 2 × 1 and 2 × 2 ranks, a refused srun, an srun sent SIGUSR2, and the
    single-node sweep that is their reference, all at once (Slurm queues what does not fit)."""
    root = tmp_path_factory.mktemp("two_nodes")
    single = ("-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug", "dist.world_size=2,4")
    launcher = ("-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.nodes=2")
    calls = {
        "single": functools.partial(train, slurm, *single, *SMALL, f"hydra.sweep.dir={root}/single"),
        "refused": functools.partial(train, slurm, "dist.world_size=4", *SMALL, launcher=("srun", "-N2", "-n2")),
    }
    for per_node in (1, 2):
        calls[f"launcher_{per_node}"] = functools.partial(
            train,
            slurm,
            *launcher,
            f"hydra.launcher.tasks_per_node={per_node}",
            *SMALL,
            f"hydra.sweep.dir={root}/launcher_{per_node}",
        )
        calls[f"srun_{per_node}"] = functools.partial(
            train,
            slurm,
            *SMALL,
            f"hydra.run.dir={root}/srun_{per_node}",
            launcher=("srun", "--nodes=2", f"--ntasks-per-node={per_node}"),
        )
        script = _sbatch_torchrun(root, per_node)
        calls[f"torchrun_{per_node}"] = functools.partial(
            slurm.run, ["sbatch", "--wait", str(script)], cwd=REPO, env=child_env(), timeout=240
        )
    calls["sigusr2"] = functools.partial(_srun_stopped_by_sigusr2, slurm, root / "sigusr2")
    results = dict(zip(calls, together(*calls.values(), jobs=len(calls))))
    return {"root": root, **results}


@pytest.mark.parametrize("per_node", [1, 2])
@pytest.mark.parametrize("way", ["launcher", "srun", "torchrun"])
def test_one_job_over_two_nodes_trains_exactly_what_one_node_trains(two_nodes, single_node, way, per_node):
    ok(two_nodes[f"{way}_{per_node}"])
    root, world = two_nodes["root"], 2 * per_node
    run_dir = root / f"{way}_{per_node}" / ("0" if way == "launcher" else "")
    reference = summary(single_node[0] / str(world // 2 - 1))
    result = summary(run_dir)
    assert result["world_size"] == world
    assert result["losses"] == reference["losses"]
    assert result["param_checksum"] == reference["param_checksum"]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == [f"rank{r}.log" for r in range(world)]
    for rank in range(world):  # every rank's log has its lines (ranks > 0 were empty under torchrun)
        assert "done: final loss" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    if way == "launcher":
        assert f"  run dir: {run_dir}" in two_nodes[f"{way}_{per_node}"].stdout


def test_srun_with_a_world_size_of_its_own_is_refused_once(two_nodes):
    result = two_nodes["refused"]
    assert result.returncode == 2
    message = "zero_lab: invalid config (1 problem):\n  - dist.world_size=4: under srun the world size is srun's (2)"
    assert result.stderr.count("zero_lab: invalid config") == 1, result.stderr[-2000:]
    assert message in result.stderr
    assert "start one task (srun -n1) to spawn 4 ranks inside it" in result.stderr


def test_srun_ranks_stop_together_on_sigusr2_checkpoint_and_exit_non_zero(two_nodes):
    result, run_dir = two_nodes["sigusr2"], two_nodes["root"] / "sigusr2"
    assert result.returncode == 128 + 12, result.stderr[-3000:]  # no requeue here: never COMPLETED
    stopped = summary(run_dir)
    done = len(stopped["losses"])
    assert stopped["stopped_by"] == "SIGUSR2" and 1 <= done < 100000
    assert (run_dir / "checkpoints" / f"step_{done:08d}" / "manifest.json").is_file()  # checkpoint_every=0
    assert f"zero_lab: stopped by SIGUSR2 after {done} steps" in result.stderr
    assert result.stderr.count("zero_lab: stopped by") == 1  # said once, by rank 0


#: The time-limit test's run. In the limited job its data is held (tests/slurm/gated_data.py: 0.5 s a
#: step) until the test sees the job requeued, so the first attempt lasts at least 400 x 0.5 s = 200 s:
#: it is always still training when the signal comes; the reference and the requeued attempt run at
#: full speed.
STEPS = 400
HELD = f"data._target_={GatedRegression.__module__}.{GatedRegression.__qualname__}"
LONG = ("logger=none", "progress=false", f"steps={STEPS}", "log_every=1", HELD)
#: The limited job's signal lead: slurmctld tests time limits every LIMIT_CHECK_S and sends SIGUSR2 at the
#: first test at which the job's end is less than SIGNAL_DELAY_S + LIMIT_CHECK_S away.
SIGNAL_DELAY_S = 90


def _job_line(slurm: SlurmCluster) -> str | None:
    """``scontrol show job -o`` of the one job in the cluster, or ``None``."""
    lines = slurm.run(["scontrol", "show", "job", "-o"], timeout=30).stdout.splitlines()
    return next((line for line in lines if line.startswith("JobId=")), None)


def _field(line: str, key: str) -> str:
    return next(word.split("=", 1)[1] for word in line.split() if word.startswith(f"{key}="))


def _seconds(run_time: str) -> int:
    """``[days-]HH:MM:SS`` in seconds."""
    days, _, clock = run_time.rpartition("-")
    hours, minutes, seconds = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def _time_limit_after_events(slurm: SlurmCluster, run_dir: Path, gate: Path, timeout_s: float = 400) -> str:
    """Drive the job's time limit by what it has done, not by how fast it does it:

    1. once its first attempt has trained a step (a line in ``metrics.jsonl``), bring its limit
       to the whole minute that leaves between SIGNAL_DELAY_S + 10 and + 70 s: the next
       time-limit test, or the one after, signals it (while its held data keeps it training),
       and it has at least SIGNAL_DELAY_S - 20 s to checkpoint and requeue before the limit;
    2. once it has been requeued, give it 10 minutes (each attempt of a short job would be cut
       short, however little it has left) and open its data's ``gate``: it runs at full speed.

    Returns what happened, for the test's message."""
    deadline = time.monotonic() + timeout_s
    metrics, limited, seen = run_dir / "metrics.jsonl", False, False
    while time.monotonic() < deadline:
        line = _job_line(slurm)
        if line is None:
            if seen:  # it ended without a requeue: the test says why
                return "the job ended" + (" after its limit was brought near" if limited else " before a step")
            time.sleep(0.5)  # not queued yet: the submitting command is still starting
            continue
        seen = True
        job = _field(line, "JobId")
        if "Restarts=1" in line:
            slurm.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"], timeout=30)
            gate.touch()
            return "requeued"
        if not limited and metrics.is_file() and metrics.read_text().strip():
            minutes = -(-(_seconds(_field(line, "RunTime")) + SIGNAL_DELAY_S + 10) // 60)
            slurm.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], timeout=30)
            limited = True
        time.sleep(0.5)
    return "timed out waiting"


# Slurm's limits are whole minutes and its time-limit check runs periodically: the job's limit is
# brought near once it has trained (1-2 min), then it checkpoints, requeues and finishes (about 5 min
# in all on 2 cores), within _time_limit_after_events' own 400 s bound, not pytest's default 300 s.
@pytest.mark.timeout(600)
def test_a_job_at_its_time_limit_checkpoints_requeues_and_ends_as_an_uninterrupted_run(slurm, tmp_path):
    sweep, plain, gate = tmp_path / "limited", tmp_path / "plain", tmp_path / "released"
    reference = subprocess.Popen(
        [sys.executable, "train.py", *LONG, f"hydra.run.dir={plain}"],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    submit = functools.partial(
        train,
        slurm,
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.timeout_min=10",  # far away until the job has trained a step (_time_limit_after_events)
        f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}",
        *LONG,
        f"hydra.sweep.dir={sweep}",
        timeout=600,
        env={**child_env(), GATE: str(gate)},
    )
    limited, happened = together(submit, functools.partial(_time_limit_after_events, slurm, sweep / "0", gate))
    assert happened == "requeued", (happened, limited.stderr[-3000:])
    _, stderr = reference.communicate(timeout=240)
    assert reference.returncode == 0, stderr[-3000:]
    ok(limited)
    run = summary(sweep / "0")
    assert run["requeued"] is not None and run["requeued"]["restarts"] == 1, run
    first = summary(sweep / "0" / "earlier" / "1")  # the first attempt's summary, set aside
    assert first["stopped_by"] == "SIGUSR2" and len(first["losses"]) < STEPS
    assert run["requeued"]["from_step"] == run["start_step"] == len(first["losses"])  # its checkpoint
    assert run["resumed_from"] == str(sweep / "0") and run["stopped_by"] is None
    assert run["final_loss"] == summary(plain)["final_loss"]
    assert run["param_checksum"] == summary(plain)["param_checksum"]
    assert f"  run dir: {sweep / '0'}" in limited.stdout  # the submitting command shows where it ended
    assert_no_leftover_processes()
