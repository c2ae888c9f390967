"""SIGTERM / SIGINT / SIGUSR2 as requests to stop, not as death: the one place handlers are installed.

A scheduler's SIGTERM (Slurm before preemption or on ``scancel``, ``kill``, torchrun's agent),
Slurm's SIGUSR2 before a job's time limit (``--signal=USR2@<s>``, which submitit asks for) or
a Ctrl-C should not kill a rank in the middle of a collective or of a checkpoint.

* :class:`StopRequest` (in a rank): the signals only record themselves. The app's loop
  sends the recorded number along with its per-step metrics (one all-gather it makes
  anyway), so every rank learns *in the same step* that some rank was asked to stop,
  saves the checkpoint together and leaves the loop together; a checkpoint being
  written when the signal arrives is finished first.
* :func:`handling_stop_signals` (used by :func:`zero_lab.runtime.spawn.run_world` in the
  parent): route both signals to any handler for the duration of a block.
* :func:`stopping_raises` (the job process, before and after its ranks run: composing, checking,
  finishing): SIGTERM / SIGINT raise :class:`Stopped`, which says what the job was doing and
  what it kept, so cleanup runs on the way out (no leaked semaphores, no orphan) and the job
  ends with one line (:mod:`zero_lab.app.launch.entry`) instead of dying mid-call or printing
  a ``KeyboardInterrupt`` traceback.

Handlers are installed only in the main thread (Python allows no other; elsewhere the
signals act as before) and the previous handlers are restored on exit. Once the run has
stopped and saved, :func:`hand_back` gives the signal to the handler that was there before
(submitit's: on SIGUSR2 it calls the task's ``checkpoint()`` and requeues the job).

    with StopRequest() as stop:
        for step in ...:
            ...
            if any_rank_reports(stop.signum): save(); break
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from types import FrameType
from typing import Any

__all__ = [
    "STOP_SIGNALS",
    "StopRequest",
    "StopStage",
    "Stopped",
    "blocked_for_children",
    "hand_back",
    "handling_stop_signals",
    "signal_name",
    "stopping_raises",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)


def signal_name(signum: int) -> str:
    """``15`` -> ``"SIGTERM"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextmanager
def handling_stop_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Send SIGTERM, SIGINT and SIGUSR2 to ``handler`` inside the block (main thread only)."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Stopped(BaseException):
    """SIGTERM / SIGINT came while the job was ``doing`` something no rank loop handles (a
    ``BaseException``, as ``KeyboardInterrupt``: no ``except Exception`` swallows it); ``kept``
    says what it leaves behind."""

    def __init__(self, signum: int, doing: str, kept: str):
        self.signum, self.doing, self.kept = signum, doing, kept
        super().__init__(f"stopped by {signal_name(signum)} while {doing}; {kept}")


class StopStage:
    """What :func:`stopping_raises` says when a signal comes: ``doing`` and ``kept`` (a callable is
    asked then); :meth:`now` moves it on. It is the handler (``previous``: those it replaced)."""

    def __init__(self, doing: str, kept: str | Callable[[], str], previous: dict[int, Any]):
        self.doing, self.kept, self.previous = doing, kept, previous

    def now(self, doing: str, kept: str | Callable[[], str]) -> None:
        self.doing, self.kept = doing, kept

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        kept = self.kept() if callable(self.kept) else self.kept
        raise Stopped(signum, self.doing, kept)


@contextmanager
def stopping_raises(doing: str, kept: str | Callable[[], str] = "nothing was written") -> Iterator[StopStage]:
    """Inside the block (main thread only), SIGTERM and SIGINT raise :class:`Stopped` naming what
    the job is ``doing`` and what it ``kept`` (``stage.now(...)`` moves both on); the handlers
    before it are restored on the way out. Blocks nest: the innermost one speaks.

        with stopping_raises("checking the config") as stage: ...; stage.now("finishing", kept)
    """
    stage = StopStage(doing, kept, {})
    if threading.current_thread() is not threading.main_thread():
        yield stage
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        stage.previous[sig] = signal.signal(sig, stage)
    try:
        yield stage
    finally:
        for sig, old in stage.previous.items():
            signal.signal(sig, old)


def hand_back(signum: int) -> bool:
    """Call the handler installed for ``signum`` now (the one :class:`StopRequest` replaced,
    restored) as if the signal had just come; False where there is none (default or ignored,
    Python's own ``KeyboardInterrupt`` handler, or only :func:`stopping_raises`' own, which is
    looked through to the handler it replaced: the job already stopped and says so itself).

    Under submitit that handler is its checkpoint-and-requeue on SIGUSR2 (task 0 dumps the
    ``checkpoint()`` it returns and calls ``scontrol requeue``, then exits), its logging bypass
    on SIGTERM. SIGTERM is ignored meanwhile, and so by the processes the handler starts: the
    requeue makes Slurm SIGTERM every process of the job, ``scontrol requeue`` included, and
    an ``scontrol`` killed before it exits makes submitit report the job failed. Outside the
    main thread nothing is called.
    """
    handler = signal.getsignal(signum)
    while isinstance(handler, StopStage):
        handler = handler.previous.get(signum)
    if not callable(handler) or handler is signal.default_int_handler:
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        handler(signum, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return True


@contextmanager
def blocked_for_children(signums: tuple[int, ...] = (signal.SIGUSR2,)) -> Iterator[None]:
    """Block ``signums`` in this thread inside the block, so processes started in it begin with
    them blocked (the mask survives fork and exec): Slurm's SIGUSR2 reaches every process of a
    job step, and a rank still importing torch would die of it. The rank's :class:`StopRequest`
    unblocks them, and a signal that came meanwhile is delivered to it then.

    multiprocessing's resource tracker is started first: the call that starts it (made by the
    first forkserver, spawned process or queue of a process) unblocks SIGINT and SIGTERM in the
    calling thread once the tracker runs, which inside the block would start the children after
    it (a forkserver, and so every rank forked from it) with both unblocked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class StopRequest:
    """Records the first stop signal instead of dying; ``signum`` is 0 until one comes."""

    def __init__(self) -> None:
        self.signum = 0
        self._handling = handling_stop_signals(self._record)

    def __enter__(self) -> StopRequest:
        self._handling.__enter__()
        if threading.current_thread() is threading.main_thread():  # see blocked_for_children
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handling.__exit__(*exc)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
