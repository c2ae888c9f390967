"""A progress bar for rank 0 (steps, loss, it/s) that stays out of logs and CI.

The bar draws only when enabled *and* stderr is a terminal; under pytest, CI, SLURM or a
redirected log it is a no-op, so log files hold no carriage-return noise.

    with Progress(total=100, start=0, enabled=rank == 0) as bar:
        bar.update({"train/loss": 0.5})
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from tqdm import tqdm

from zero_lab.app.record.catalogue import LOSS

__all__ = ["Progress"]


class _RankBar(tqdm):
    """tqdm with a thread lock of its own: ``get_lock()`` finds it, so tqdm never creates its default
    ``multiprocessing.RLock``, a named semaphore the resource tracker registers, which a rank
    ending with ``os._exit`` (:mod:`zero_lab.runtime.spawn`) never unlinked ("leaked semaphore
    objects" after every interactive run). One process draws the bar: a thread lock is enough."""

    _lock = threading.RLock()


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream: TextIO | None = None):
        stream = sys.stderr if stream is None else stream
        self._bar = None
        if enabled and stream.isatty():
            self._bar = _RankBar(total=total, initial=start, unit="step", dynamic_ncols=True, leave=False, file=stream)

    def update(self, record: dict[str, Any]) -> None:
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{record[LOSS.key]:.4g}")  # redraws: step and loss agree

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()
