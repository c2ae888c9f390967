"""Stop a training loop cleanly on SIGTERM / SIGINT: finish the step, checkpoint, exit.

A scheduler's SIGTERM (SLURM before preemption or ``scancel``, ``kill``, torchrun's agent)
or a Ctrl-C should not kill a rank in the middle of a collective or of a checkpoint.
Inside :class:`StopRequest` the two signals only record themselves; the loop sends the
recorded signal number along with its per-step metrics (one all-gather it makes anyway),
so every rank learns *in the same step* that some rank was asked to stop, saves the
checkpoint together and leaves the loop together. A checkpoint being written when the
signal arrives is finished first. The parent that started the ranks forwards its own
signals to them and kills them on a second signal (:func:`zero_lab.launch.run_world`).

    with StopRequest() as stop:
        for step in ...:
            ...
            if any_rank_reports(stop.signum): save(); break
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "StopRequest", "signal_name"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """``15`` -> ``"SIGTERM"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequest:
    """Records the first SIGTERM/SIGINT instead of dying; ``signum`` is 0 until one comes.

    Handlers are installed only in the main thread (Python allows no other) and the
    previous handlers are restored on exit.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *_: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
