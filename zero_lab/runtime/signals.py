"""SIGTERM / SIGINT as requests to stop, not as death: the one place handlers are installed.

A scheduler's SIGTERM (SLURM before preemption or ``scancel``, ``kill``, torchrun's agent)
or a Ctrl-C should not kill a rank in the middle of a collective or of a checkpoint.

* :class:`StopRequest` (in a rank): the signals only record themselves. The app's loop
  sends the recorded number along with its per-step metrics (one all-gather it makes
  anyway), so every rank learns *in the same step* that some rank was asked to stop,
  saves the checkpoint together and leaves the loop together; a checkpoint being
  written when the signal arrives is finished first.
* :func:`handling_stop_signals` (used by :func:`zero_lab.runtime.launch.run_world` in the
  parent): route both signals to any handler for the duration of a block.

Handlers are installed only in the main thread (Python allows no other; elsewhere the
signals act as before) and the previous handlers are restored on exit.

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
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "StopRequest", "handling_stop_signals", "signal_name"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """``15`` -> ``"SIGTERM"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextmanager
def handling_stop_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Send SIGTERM and SIGINT to ``handler`` inside the block (main thread only)."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class StopRequest:
    """Records the first SIGTERM/SIGINT instead of dying; ``signum`` is 0 until one comes."""

    def __init__(self) -> None:
        self.signum = 0
        self._handling = handling_stop_signals(self._record)

    def __enter__(self) -> StopRequest:
        self._handling.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handling.__exit__(*exc)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
