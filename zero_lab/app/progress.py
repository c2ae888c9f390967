"""A progress bar for rank 0 (steps, loss, it/s) that stays out of logs and CI.

The bar draws only when enabled *and* stderr is a terminal; under pytest, CI, SLURM or a
redirected log it is a no-op, so log files hold no carriage-return noise.

    with Progress(total=100, start=0, enabled=rank == 0) as bar:
        bar.update({"train/loss": 0.5})
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream: TextIO | None = None):
        stream = sys.stderr if stream is None else stream
        self._bar = None
        if enabled and stream.isatty():
            self._bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, leave=False, file=stream)

    def update(self, record: dict[str, Any]) -> None:
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{record['train/loss']:.4g}", refresh=False)
            self._bar.update(1)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()
