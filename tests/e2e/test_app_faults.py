"""Faults, end to end: SIGTERM mid-run stops cleanly and resumes exactly (also resharded),
a second signal kills the ranks without losing the last checkpoint, and killing the job
process with SIGKILL leaves no rank behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.e2e.runs import (
    REPO,
    TORCHRUN,
    assert_close,
    assert_no_leftover_processes,
    child_env,
    summary,
    train_together,
    wait_until_no_leftover_processes,
)
from zero_lab.checkpoint import export_plain_state_dict, latest_checkpoint
from zero_lab.runtime.signals import StopRequest

FOREVER = "steps=100000"  # never finishes on its own: the signal always lands mid-training
TRAIN = (sys.executable, "train.py")
CONSOLE = (str(Path(sys.executable).with_name("zero-lab-train")),)  # this environment's console script


def start(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """``python train.py *args`` in the background, its output captured."""
    return subprocess.Popen(
        [sys.executable, "train.py", "logger=none", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.05)


def test_stop_request_records_the_signal_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert stop.signum == 0
        os.kill(os.getpid(), signal.SIGTERM)  # would end pytest without the handler
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGTERM  # the first one counts
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_stops_after_a_step_checkpoints_and_resumes_exactly(tmp_path):
    """A run of the default job (ZeRO-Adam, W=2) that would never end is stopped by SIGTERM once
    its second checkpoint is written (an event, not a speed: however many steps it made before
    the signal landed, ``done``); an uninterrupted run of ``done + 4`` steps, and the resumes to
    the same length (one resharded to W=4 with Flat), are then compared with it."""
    interrupted = tmp_path / "interrupted"
    proc = start(interrupted, FOREVER, "checkpoint_every=2")
    wait_for(interrupted / "checkpoints" / "step_00000002" / "manifest.json", proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    stopped = summary(interrupted)
    done = len(stopped["losses"])
    assert stopped["stopped_by"] == "SIGTERM" and done >= 2
    newest = f"{interrupted}/checkpoints/step_{done:08d}"
    assert f"stopped by SIGTERM after {done} steps; continue from step {done} ({newest}) with: " in stderr
    assert f"resume={interrupted}" in stderr and "Traceback" not in stderr
    assert not list((interrupted / "checkpoints").glob(".*partial"))  # the stop-time save finished
    assert_no_leftover_processes()

    steps = f"steps={done + 4}"
    uninterrupted, resumed, resharded = tmp_path / "uninterrupted", tmp_path / "resumed", tmp_path / "resharded"
    both = ("logger=none", steps, f"resume={interrupted}")
    for result in train_together(
        ("logger=none", steps, f"hydra.run.dir={uninterrupted}"),
        (*both, f"hydra.run.dir={resumed}"),
        (*both, "dist.world_size=4", "partitioner=flat", f"hydra.run.dir={resharded}"),
    ):
        assert result.returncode == 0, result.stderr[-3000:]
    reference = summary(uninterrupted)
    assert stopped["losses"] == reference["losses"][:done]
    exact = summary(resumed)
    assert exact["start_step"] == done
    assert exact["losses"] == reference["losses"]  # every later step equal, bit for bit
    assert exact["param_checksum"] == reference["param_checksum"]
    other = summary(resharded)
    assert (other["world_size"], other["start_step"], other["partition"]["imbalance"]) == (4, done, 1.0)
    assert_close(other["losses"], reference["losses"], 1e-5)  # W=4 sums the same batch in another order


def test_a_second_signal_kills_the_ranks_and_the_last_checkpoint_still_loads(tmp_path):
    run_dir = tmp_path / "run"
    big = ("model.hidden=1024", "model.depth=6")  # steps + saves of ~100 ms: the second signal lands mid-stop
    proc = start(run_dir, FOREVER, "checkpoint_every=1", *big)
    wait_for(run_dir / "checkpoints" / "step_00000002" / "manifest.json", proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by SIGTERM: SIGTERM came twice, the ranks were killed" in stderr and "Traceback" not in stderr
    wait_until_no_leftover_processes()

    latest = latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and int(latest.name.removeprefix("step_")) >= 2
    plain = torch.load(export_plain_state_dict(latest, tmp_path / "adam.pt"), weights_only=True)  # checksums verified
    model_state = torch.load(latest / "model.pt", weights_only=True)
    params = [torch.nn.Parameter(t.clone()) for t in model_state.values()]
    adam = torch.optim.Adam(params)
    adam.load_state_dict(plain)
    assert [adam.state[p]["exp_avg"].shape for p in params] == [p.shape for p in params]


def test_killing_the_job_process_leaves_no_rank_running(tmp_path):
    proc = start(tmp_path / "run", FOREVER)
    wait_for(tmp_path / "run" / "metrics.jsonl", proc)
    proc.kill()  # SIGKILL: nothing in the job can react; the ranks die with their parent
    proc.communicate(timeout=30)
    wait_until_no_leftover_processes()


def test_sigterm_to_torchrun_stops_its_ranks_after_one_step_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [TORCHRUN, "--standalone", "--nproc_per_node", "2", "train.py", "logger=none", FOREVER, "checkpoint_every=4",
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for(run_dir / "checkpoints" / "step_00000004" / "manifest.json", proc)
    proc.send_signal(signal.SIGTERM)  # torchrun's agent sends SIGTERM on to every rank
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0  # torchrun reports its own SignalException
    stopped = summary(run_dir)
    done = len(stopped["losses"])
    assert stopped["stopped_by"] == "SIGTERM"
    assert f"zero_lab: stopped by SIGTERM after {done} steps" in output
    assert (run_dir / "checkpoints" / f"step_{done:08d}" / "manifest.json").is_file()
    wait_until_no_leftover_processes()


# ----------------------------------------------------------------------------- a signal at any moment
def _children(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the live children of ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append((int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _importing_torch(proc: subprocess.Popen[str], _run_dir: Path) -> bool:
    return "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()


def _forkserver_started(proc: subprocess.Popen[str], _run_dir: Path) -> bool:
    """The check callback started the forkserver: the config is being checked."""
    return any("forkserver" in cmd for _, cmd in _children(proc.pid))


def _ranks_forked(proc: subprocess.Popen[str], _run_dir: Path) -> bool:
    """The forkserver has children: the ranks are starting (or already training)."""
    return any(_children(pid) for pid, cmd in _children(proc.pid) if "forkserver" in cmd)


def _first_step_logged(_proc: subprocess.Popen[str], run_dir: Path) -> bool:
    metrics_file = run_dir / "metrics.jsonl"
    return metrics_file.exists() and metrics_file.read_text().count("\n") >= 1


def signal_at(event, signum: int, run_dir: Path, *args: str, command: tuple[str, ...] = TRAIN) -> tuple[int, str]:
    """Start ``command`` (``train.py``) in a session of its own, send ``signum`` once ``event(proc, run_dir)``
    holds (SIGINT to the whole process group, as a Ctrl-C; SIGTERM to the job process, as
    ``kill``); its exit code and stderr, once no process of it is left."""
    proc = subprocess.Popen(
        [*command, "logger=none", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not event(proc, run_dir):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{event.__name__} did not happen"
        time.sleep(0.005)
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=180)
    wait_until_no_leftover_processes()
    return proc.returncode, stderr


def assert_one_line(stderr: str, expected: str) -> str:
    """stderr is the one ``zero_lab:`` line matching ``expected`` (a regex): no traceback, no
    ``KeyboardInterrupt``, no resource_tracker warning about leaked semaphores."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(f"zero_lab: {expected}", lines[0]), stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("command", [TRAIN, CONSOLE], ids=["train.py", "zero-lab-train"])
def test_sigterm_while_python_imports_torch_is_one_line_and_143(tmp_path, command):
    code, stderr = signal_at(_importing_torch, signal.SIGTERM, tmp_path / "run", command=command)
    assert code == 128 + signal.SIGTERM
    assert_one_line(stderr, "stopped by SIGTERM while starting; nothing was written")
    assert not (tmp_path / "run").exists()


def test_sigterm_while_the_config_is_checked_is_one_line_and_leaves_no_process(tmp_path):
    """The forkserver starts as the check begins; on a loaded machine the check may be over when
    the signal lands, and the job then says it was preparing."""
    run_dir = tmp_path / "run"
    code, stderr = signal_at(_forkserver_started, signal.SIGTERM, run_dir)
    assert code == 128 + signal.SIGTERM
    assert_one_line(
        stderr,
        "stopped by SIGTERM while (composing and checking the config; nothing was written|"
        f"preparing the job; {re.escape(str(run_dir))} holds its config, no step was trained)",
    )


def test_ctrl_c_while_the_ranks_start_is_one_line_130_and_the_job_log_says_how_far_it_got(tmp_path):
    """Ctrl-C (SIGINT to the whole process group: job, forkserver, ranks) the moment the ranks are
    forked: the ranks are stopped before their first step, or (if they were quicker) stop after
    it with a checkpoint; either way one line, exit code 130, and train.log ends with that line."""
    run_dir = tmp_path / "run"
    code, stderr = signal_at(_ranks_forked, signal.SIGINT, run_dir, FOREVER)
    assert code == 128 + signal.SIGINT
    line = assert_one_line(
        stderr,
        r"stopped by SIGINT(: the ranks were stopped while starting, before any step; no complete checkpoint in "
        r".*/checkpoints to resume from; start again with: .*"
        r"| after (\d+) steps; continue from step \2 \(.*\) with: .*)",
    )
    assert (run_dir / "train.log").read_text().splitlines()[-1].endswith(line.removeprefix("zero_lab: "))


def test_ctrl_c_as_the_first_steps_are_logged_stops_with_a_checkpoint_and_130(tmp_path):
    run_dir = tmp_path / "run"
    code, stderr = signal_at(_first_step_logged, signal.SIGINT, run_dir, FOREVER, "checkpoint_every=5")
    assert code == 128 + signal.SIGINT
    newest = rf"{run_dir}/checkpoints/step_\d+"
    assert_one_line(stderr, rf"stopped by SIGINT after (\d+) steps; continue from step \1 \({newest}\) with: .*")
    done = len(summary(run_dir)["losses"])
    assert summary(run_dir)["stopped_by"] == "SIGINT"
    assert (run_dir / "checkpoints" / f"step_{done:08d}" / "manifest.json").is_file()
