"""A job Slurm requeued continues from the checkpoint its last attempt saved in its run dir.

continue_requeued_run(config, run_dir, meta)   # sets config["resume"], meta["requeued"]
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from zero_lab.checkpoint import checkpoint_step, find_checkpoint
from zero_lab.runtime import slurm

__all__ = ["continue_requeued_run"]

log = logging.getLogger("zero_lab.app")


def continue_requeued_run(config: dict[str, Any], run_dir: Path, meta: dict[str, Any]) -> None:
    """In a job Slurm requeued (``SLURM_RESTART_COUNT`` > 0) with no ``resume=`` of its own,
    resume from the newest checkpoint in this run dir; ``meta["requeued"]`` (summary.json's
    ``requeued``) records how often and from which step, ``None`` on a first start."""
    restarts = slurm.requeue_count(os.environ)
    meta["requeued"] = None
    if not restarts or config.get("resume") is not None:
        return
    found = find_checkpoint(run_dir)
    meta["requeued"] = {"restarts": restarts, "from_step": 0, "checkpoint": None}
    if found is None:
        log.warning("requeued (%d) but no checkpoint in %s: starting from step 0", restarts, run_dir)
        return
    config["resume"] = str(run_dir)
    meta["requeued"].update(from_step=checkpoint_step(found), checkpoint=str(found))
    log.info("requeued (%d): resuming from %s", restarts, found)
