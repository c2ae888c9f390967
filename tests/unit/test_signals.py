"""Stop signals: SIGUSR2 stops like SIGTERM, is handed back to the handler it replaced, and waits
in children started while it is blocked (runtime/signals.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from zero_lab.runtime.signals import (
    STOP_SIGNALS,
    Stopped,
    StopRequest,
    blocked_for_children,
    hand_back,
    stopping_raises,
)


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
