"""A rank's log, ``<run dir>/logs/rank{r}.log``. Hydra's logging config disables the loggers that
exist when it runs (``disable_existing_loggers: true``), which would leave the log of ranks > 0
under torchrun or srun empty: zero_lab's own loggers are enabled again here.

    log_to_file(run_dir, rank)
"""

from __future__ import annotations

import logging
from pathlib import Path

from zero_lab.app.record.run_files import LOGS_DIR

__all__ = ["log_to_file"]


def log_to_file(run_dir: Path, rank: int) -> None:
    """Send the ``zero_lab`` loggers of this process to ``<run dir>/logs/rank{r}.log``."""
    path = run_dir / LOGS_DIR / f"rank{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger("zero_lab")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name, logger in logging.Logger.manager.loggerDict.items():  # undo Hydra's disable_existing_loggers
        if (name == "zero_lab" or name.startswith("zero_lab.")) and isinstance(logger, logging.Logger):
            logger.disabled = False
