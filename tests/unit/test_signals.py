"""Stop signals: SIGUSR2 stops like SIGTERM, is handed back to the handler it replaced, and waits
in children started while it is blocked (runtime/signals.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from zero_lab.runtime.signals import (
    STOP_SIGNALS,
    Stopped,
    StopRequest,
    blocked_for_children,
    hand_back,
    stopping_raises,
)

ROOT = Path(__file__).resolve().parents[2]


def test_sigusr2_is_recorded_then_handed_back_to_the_handler_it_replaced_with_sigterm_ignored():
    seen: list[tuple[int, object]] = []
    before_term = signal.getsignal(signal.SIGTERM)
    previous = signal.signal(signal.SIGUSR2, lambda signum, _: seen.append((signum, signal.getsignal(signal.SIGTERM))))
    try:
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            deadline = time.monotonic() + 5
            while not stop.signum and time.monotonic() < deadline:
                time.sleep(0.01)
        assert signal.SIGUSR2 in STOP_SIGNALS and stop.signum == signal.SIGUSR2 and seen == []
        assert hand_back(signal.SIGUSR2) is True  # submitit's checkpoint-and-requeue would run here
        assert seen == [(signal.SIGUSR2, signal.SIG_IGN)]  # so `scontrol requeue` outlives Slurm's SIGTERM
        assert signal.getsignal(signal.SIGTERM) is before_term
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert hand_back(signal.SIGUSR2) is False  # nobody to hand it to: the job exits 128 + signal itself
    finally:
        signal.signal(signal.SIGUSR2, previous)


def _blocked(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()  # noqa: SIM115 - read once
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)


def test_children_started_inside_blocked_for_children_begin_with_sigusr2_blocked():
    with blocked_for_children():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _blocked(child.pid) & (1 << (signal.SIGUSR2 - 1))  # a SIGUSR2 now waits, it does not kill
        child.send_signal(signal.SIGUSR2)
        time.sleep(0.2)
        assert child.poll() is None
        assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the parent's mask is back
    finally:
        child.kill()
        child.wait(timeout=10)


def test_the_forkserver_starts_with_every_stop_signal_blocked_in_a_fresh_process():
    """Starting multiprocessing's resource tracker unblocks SIGINT and SIGTERM in the starting
    thread; a forkserver started after that gave its ranks a Ctrl-C as a KeyboardInterrupt
    mid-start (a traceback, or a rank stuck on a lock the exception left held: CI's run hung).
    A fresh interpreter, so the tracker is not running yet."""
    start = "from multiprocessing import forkserver; from zero_lab.runtime import spawn; spawn.start_forkserver()"
    report = "print(forkserver._forkserver._forkserver_pid, flush=True); import sys; sys.stdin.read()"
    job = subprocess.Popen(
        [sys.executable, "-c", f"{start}; {report}"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        server = int(job.stdout.readline())
        blocked = _blocked(server)
        assert all(blocked & (1 << (sig - 1)) for sig in STOP_SIGNALS), hex(blocked)
    finally:
        job.communicate("", timeout=30)
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_stopping_raises_names_what_the_job_was_doing_and_kept_then_restores_the_handlers():
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    caught: list[Stopped] = []
    with stopping_raises("checking the config") as stage:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at the next bytecode; never reached
        except Stopped as stopped:
            caught.append(stopped)
        stage.now("finishing the run", lambda: "everything was kept")
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except Stopped as stopped:
            caught.append(stopped)
    assert [(s.signum, str(s)) for s in caught] == [
        (signal.SIGTERM, "stopped by SIGTERM while checking the config; nothing was written"),
        (signal.SIGINT, "stopped by SIGINT while finishing the run; everything was kept"),
    ]
    assert not isinstance(caught[0], Exception)  # no `except Exception` on the way swallows it
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_hand_back_calls_no_keyboard_interrupt_and_looks_through_its_own_handlers():
    """A job stopped by Ctrl-C hands SIGINT back: Python's own handler would raise KeyboardInterrupt
    (a traceback and exit -2 after the job had stopped cleanly); only a handler of someone else's
    (submitit's) is called, also from under :func:`stopping_raises`."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stopping_raises("finishing the run"):
            assert hand_back(signal.SIGINT) is False
        seen: list[int] = []
        signal.signal(signal.SIGINT, lambda signum, _: seen.append(signum))
        with stopping_raises("finishing the run"):
            assert hand_back(signal.SIGINT) is True
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_stop_signal_after_the_job_returned_is_one_line_and_128_plus_the_signal(tmp_path):
    """train.py's last window: the job has returned and the interpreter is ending (atexit: W&B's and
    zero_lab's threads). A SIGTERM there, sent here from an atexit hook that outlives it, is one line
    and rc 143, not a silent death by the signal (rc -15)."""
    script = tmp_path / "exiting.py"
    script.write_text(
        "import atexit, os, runpy, signal, sys, time\n"
        "import zero_lab.app.launch.entry as entry\n"
        "entry.main = lambda: None  # the job itself is not what this test is about\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(60)))\n"
        f"sys.argv = [{str(ROOT / 'train.py')!r}]\n"
        f"runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 128 + signal.SIGTERM, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines() == [
        "zero_lab: stopped by SIGTERM while exiting; the job had ended, its files are kept"
    ], done.stderr


def test_the_console_scripts_entry_point_loads_without_torch_so_its_signal_guard_comes_first():
    """``zero-lab-train`` calls pyproject's ``[project.scripts]`` target: importing it must not load torch
    (a second or more, in which a SIGTERM would kill the job silently), so the guard it installs comes
    first. Read from pyproject, imported in a fresh interpreter as the console script does."""
    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["zero-lab-train"]
    module, function = target.split(":")
    probe = f"import sys; from {module} import {function}; print(sorted({{'torch', 'hydra'}} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"], (target, done.stdout)
