"""What reproduces a job, written to its ``meta.json``: command, overrides, choices, git revision, host.

meta = run_meta(HydraConfig.get(), choices)
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from hydra.types import RunMode

from zero_lab.app.config.paths import SOURCE_DIR
from zero_lab.app.record.run_files import COMMAND

__all__ = ["run_meta"]


def run_meta(hydra_cfg: Any, choices: dict[str, Any]) -> dict[str, Any]:
    """What reproduces this job: command, overrides, choices, git revision, host; W&B group/name."""
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    meta: dict[str, Any] = {
        "command": shlex.join([*COMMAND, *overrides]),  # pasteable as is
        "argv": list(sys.argv),
        "overrides": overrides,
        "choices": {k: v for k, v in choices.items() if not str(k).startswith("hydra/")},
        "git": git_revision(),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "seeds": "model init: seed; step s on rank r: stream_seed(seed, 'rank', r, 'step', s); data: (seed, step)",
        "multirun": multirun,
        "group": None,
        "name": None,
    }
    if multirun:
        sweep_dir = Path(str(hydra_cfg.sweep.dir))
        meta["group"] = "sweep-" + "_".join(sweep_dir.parts[-2:])
        meta["name"] = hydra_cfg.job.override_dirname or f"job{hydra_cfg.job.num}"
        meta["job_num"] = hydra_cfg.job.num
    return meta


def git_revision() -> dict[str, Any]:
    """HEAD of the project's git checkout and whether the tree had local changes (``None``: no checkout)."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(SOURCE_DIR), *args], capture_output=True, text=True, timeout=10)

    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"rev": None, "dirty": None}
    if head.returncode != 0:
        return {"rev": None, "dirty": None}
    return {"rev": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
