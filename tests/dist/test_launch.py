"""``run_world`` under signals: the parent forwards its first SIGTERM to the ranks, and a
world that cannot stop cleanly is killed and reported as :class:`Interrupted`."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.dist.worlds import run_ranks
from tests.e2e.runs import process_alive
from zero_lab.runtime.spawn import Interrupted, RankStalled


def signal_me_when_ranks_are_up(pid_dir: Path, world_size: int) -> threading.Thread:
    """SIGTERM this (the parent) process once every rank has written its pid."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + 60
        while len(list(pid_dir.glob("rank*.pid"))) < world_size and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("ignore_sigterm", "why"),
    [(False, "the ranks were stopped while starting, before any step"), (True, "did not stop within 1 s")],
    ids=["ranks-die-of-it", "ranks-ignore-it"],
)
def test_sigterm_to_the_parent_reaches_the_ranks_and_nothing_is_left(tmp_path, ignore_sigterm, why):
    signal_me_when_ranks_are_up(tmp_path, 2)
    # the ranks sleep past the world's deadline: a signal not forwarded ends in TimeoutError, not Interrupted
    with pytest.raises(Interrupted, match=why) as caught:
        run_ranks(wait_for_stop, 2, ignore_sigterm, str(tmp_path), stop_grace_s=1.0)
    assert caught.value.signum == signal.SIGTERM
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if process_alive(pid)] == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the parent's handler was restored


@pytest.mark.parametrize(
    ("stall_timeout_s", "timeout_s", "why"),
    [
        (
            1.0,
            120.0,
            r"^stalled: no progress for \d+ s after 3 step\(s\) \(bound: slowest step [\d.]+ s \+ stall timeout 1 s\)",
        ),
        (None, 3.0, r"^did not arrive at a collective: rank 0 gave up waiting \(RuntimeError: .*Timed out"),
    ],
    ids=["stall-bound", "collective-timeout"],
)
def test_a_stopped_rank_is_named_not_the_peer_that_waits(tmp_path, stall_timeout_s, timeout_s, why):
    with pytest.raises(RankStalled) as caught:
        run_ranks(step_then_sigstop, 2, str(tmp_path), timeout_s=timeout_s, stall_timeout_s=stall_timeout_s)
    stalled = caught.value
    assert stalled.rank == 1, stalled.summary
    assert re.search(why, stalled.summary), stalled.summary
    assert stalled.summary.endswith("its process is stopped (/proc state T: SIGSTOP or a debugger)")
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if process_alive(pid)] == []  # the stopped rank was killed too


def test_a_rank_stuck_reading_a_fifo_is_named_not_its_waiting_peer(tmp_path):
    with pytest.raises(RankStalled) as caught:
        run_ranks(step_then_sigstop, 2, str(tmp_path), 100, 3, "fifo", timeout_s=120.0, stall_timeout_s=1.0)
    assert caught.value.rank == 1, caught.value.summary
    assert re.search(r"its process sleeps \(/proc state S in \w+; e.g. reading a file, a pipe", caught.value.summary)
    assert "most likely in a collective" in caught.value.others[0]  # rank 0, waiting for it


# ---------------------------------------------------------------- rank programs
def step_then_sigstop(pid_dir: str, steps: int = 100, stop_at: int = 3, how: str = "sigstop") -> str:
    """Steps of one all-reduce and a heartbeat each; after ``stop_at`` steps rank 1 SIGSTOPs
    itself (``how="sigstop"``) or blocks reading a FIFO nobody writes (``how="fifo"``)."""
    import torch

    from zero_lab.runtime import heartbeat

    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    for step in range(steps):
        if step == stop_at and dist.get_rank() == 1:
            if how == "fifo":
                fifo = Path(pid_dir, "stuck.fifo")
                os.mkfifo(fifo)
                fifo.read_bytes()  # blocks in open(): no writer ever comes
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.all_reduce(torch.ones(4))
        heartbeat.beat()
        time.sleep(0.02)
    return "ran every step"


def wait_for_stop(ignore_sigterm: bool, pid_dir: str, seconds: float = 3600.0) -> str:
    """Write this rank's pid, then sleep (no step, no heartbeat): a rank that dies of SIGTERM, or ignores it."""
    import os
    import signal
    import time
    from pathlib import Path

    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)
    return "slept"
