"""``train.py`` on a real Slurm cluster (:mod:`tests.slurm.cluster`): the commands docs/training.md shows.

- one node: ``-m hydra/launcher=slurm`` runs a 2-job sweep as job arrays (W=2 and W=4, each
  job's ranks spawned inside its one task); its runs are the single-node references;
- two nodes, one job, 1 and 2 ranks per node, three ways: the launcher's multi-node mode,
  ``srun python train.py``, ``srun torchrun`` in an sbatch script — losses and parameter
  checksum bit-identical to the single-node run of the same world size; a mismatched
  ``dist.world_size`` under srun is refused once, with the fix;
- a job reaching its time limit: SIGUSR2 before it, checkpoint, requeue, resume by itself,
  and the final loss of an uninterrupted run.

Runs that do not depend on each other are made together (:func:`tests.e2e.runs.together`).
"""

from __future__ import annotations

import datetime
import functools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.runs import REPO, TORCHRUN, child_env, summary, together, wait_until_no_leftover_processes
from tests.slurm.cluster import LIMIT_CHECK_S, SlurmCluster
from tests.slurm.gated_data import GATE, GatedRegression

SMALL = ("logger=none", "progress=false", "steps=4")


def train(
    slurm: SlurmCluster,
    *args: str,
    launcher: tuple[str, ...] = (),
    timeout: float = 480,
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
        stdout, stderr = proc.communicate(timeout=360)
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
            slurm.run, ["sbatch", "--wait", str(script)], cwd=REPO, env=child_env(), timeout=480
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


#: A run still running when its time limit's signal comes, whatever the machine's speed: the limited
#: job's data is held (tests/slurm/gated_data.py, 0.5 s a step: 2000 steps would take 1000 s) until
#: the test sees the requeue and opens the gate; the reference run is not held. The batches are the same.
HELD = f"data._target_={GatedRegression.__module__}.{GatedRegression.__qualname__}"
LONG = ("logger=none", "progress=false", "steps=2000", "log_every=500", HELD)
#: Seconds the submitting command may take to get the job queued (interpreter, config check, sbatch),
#: on a runner busy with the suite's other worker.
SUBMIT_SLACK_S = 30
#: Seconds from the job's start (pinned with --begin) to its time-limit signal: it starts its ranks, trains a little.
#: 25 s (with a 1-minute limit) was too few beside two busy workers: the signal came while the job was still
#: starting, so submitit requeued it before a rank had trained (no first summary, no checkpoint).
SIGNAL_AFTER_S = 55
#: The job's time limit (``hydra.launcher.timeout_min``), in seconds.
LIMIT_S = 120
#: The signal's lead before the limit: slurmctld tests time limits every 30 s and signals a job at
#: the first test at which its end is less than signal_delay_s + 30 s away, so the job that starts at
#: `test - SIGNAL_AFTER_S` is signalled at that test, not at the one 30 s before (3 s of slack for a late start).
SIGNAL_DELAY_S = LIMIT_S - LIMIT_CHECK_S - SIGNAL_AFTER_S + 3


def _pinned_start(slurm: SlurmCluster) -> datetime.datetime:
    """When the job should start: SIGNAL_AFTER_S before a time-limit test that is at least
    SUBMIT_SLACK_S + SIGNAL_AFTER_S from now (so the submitting command has time to queue it)."""
    ahead = slurm.next_time_limit_check()
    while ahead < SUBMIT_SLACK_S + SIGNAL_AFTER_S:
        ahead += LIMIT_CHECK_S
    return datetime.datetime.now() + datetime.timedelta(seconds=ahead - SIGNAL_AFTER_S)


#: The states of a job that has ended (``scontrol show job`` keeps an ended job for MinJobAge).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _extend_after_the_first_requeue(slurm: SlurmCluster, sweep: Path, gate: Path, timeout_s: float = 400) -> list[str]:
    """Once the job of ``sweep`` has been requeued, give it 10 minutes (the next attempt is not cut
    short too: each attempt of a 1-minute job would be, however little it has left) and open its
    data's ``gate``, so it trains at full speed. Returns what it saw, for the test's failure message.

    The job is told from others (an earlier test's job may still be queued) by its log path, which
    lies under ``sweep``. Slurm's commands can fail or stall for a moment while slurmctld requeues
    a job (a busy controller answers "Socket timed out"): a failed or timed-out query is asked
    again, never read as an answer."""
    deadline, events = time.monotonic() + timeout_s, []

    def ask(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
        try:
            result = slurm.run(argv, timeout=30)
        except subprocess.TimeoutExpired:
            events.append(f"{argv[0]} {argv[1]}: timed out")
            return None
        if result.returncode != 0:
            events.append(f"{argv[0]} {argv[1]}: exit {result.returncode}: {result.stderr.strip()[-200:]}")
            return None
        return result

    while time.monotonic() < deadline:
        shown = ask(["scontrol", "show", "job", "-o"])
        for line in shown.stdout.splitlines() if shown else ():
            fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
            if str(sweep) not in fields.get("StdOut", ""):
                continue
            job, state = fields["JobId"], fields.get("JobState", "")
            if int(fields.get("Restarts", "0")) >= 1:
                events.append(f"job {job} requeued (Restarts={fields['Restarts']}, {state})")
                while ask(["scontrol", "update", f"JobId={job}", "TimeLimit=10"]) is None:
                    if time.monotonic() > deadline:
                        return events
                    time.sleep(0.5)
                events.append(f"job {job}: time limit now 10 min; gate open")
                gate.touch()
                return events
            if state in ENDED:  # it ended without a requeue: the test says why
                events.append(f"job {job} ended {state} without a requeue")
                return events
        time.sleep(0.5)
    events.append(f"no requeue seen in {timeout_s:g} s")
    return events


def _job_logs(sweep: Path, tail: int = 1500) -> str:
    """The end of each Slurm attempt's log under ``sweep`` (for a failure message)."""
    logs = sorted((sweep / ".submitit").glob("*/*_log.*"))
    return "\n".join(f"--- {log}:\n{log.read_text(errors='replace')[-tail:]}" for log in logs)


@pytest.mark.timeout(900)  # about 3.5 min alone (start pinned up to a minute ahead, signalled 55 s in, requeue, resume)
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
    begin = _pinned_start(slurm).strftime("%Y-%m-%dT%H:%M:%S")
    submit = functools.partial(
        train,
        slurm,
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        f"hydra.launcher.timeout_min={LIMIT_S // 60}",
        f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}",
        f"+hydra.launcher.additional_parameters.begin='{begin}'",
        *LONG,
        f"hydra.sweep.dir={sweep}",
        timeout=600,
        env={**child_env(), GATE: str(gate)},
    )
    limited, seen = together(submit, functools.partial(_extend_after_the_first_requeue, slurm, sweep, gate))
    _, stderr = reference.communicate(timeout=480)
    assert reference.returncode == 0, stderr[-3000:]
    assert limited.returncode == 0, "\n".join(["the helper saw:", *seen, _job_logs(sweep)]) + limited.stderr[-3000:]
    run = summary(sweep / "0")
    assert run["requeued"] is not None and run["requeued"]["restarts"] == 1, run
    first_attempt = sweep / "0" / "earlier" / "1"  # the first attempt's files, set aside
    assert (first_attempt / "summary.json").is_file(), "\n".join(["the helper saw:", *seen, _job_logs(sweep)])
    first = summary(first_attempt)
    assert first["stopped_by"] == "SIGUSR2" and len(first["losses"]) < 2000
    assert run["requeued"]["from_step"] == run["start_step"] == len(first["losses"])  # its checkpoint
    assert run["resumed_from"] == str(sweep / "0") and run["stopped_by"] is None
    assert run["final_loss"] == summary(plain)["final_loss"]
    assert run["param_checksum"] == summary(plain)["param_checksum"]
    assert f"  run dir: {sweep / '0'}" in limited.stdout  # the submitting command shows where it ended
    wait_until_no_leftover_processes(60)  # the job's steps exit a moment after its result is written
