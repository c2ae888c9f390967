"""Finding a run's checkpoints again, of either format, by their names and completion marks alone.

Under ``<run dir>/checkpoints/`` (:mod:`zero_lab.app.run.checkpoints` writes them):

* ``step_NNNNNNNN/`` or ``step_NNNNNNNN.pt`` — the native formats, found by the core
  (:func:`zero_lab.checkpoint.find_checkpoint`: complete when the manifest or the file is there);
* ``step_NNNNNNNN.dcp/`` — ``checkpoint_format=dcp``, complete when its record (:data:`DCP_EXTRA`) is
  there: rank 0 writes it before renaming the whole directory into place, so a checkpoint cut short
  keeps its hidden ``.step_N.dcp.partial-*`` name and is never found.

:func:`find_any` is the one finder every reader uses: ``resume=`` (its check and its load), a job
Slurm requeued, the hint a stopped run prints; :func:`all_checkpoints` is what ``keep_checkpoints``
prunes. It reads names and marks only, no tensors and
no ``torch.distributed.checkpoint``, so the config check and a closing line pay nothing for it::

    found = find_any(run_dir)  # the newest complete checkpoint of either format, or None
    step = step_of_any(found)
"""

from __future__ import annotations

import re
from pathlib import Path

from zero_lab.checkpoint import checkpoint_step, checkpoints, find_checkpoint

__all__ = ["DCP_EXTRA", "all_checkpoints", "find_any", "is_dcp", "step_of_any"]

#: A DCP checkpoint's record (the app's JSON: step, losses, classes); its presence marks it complete.
DCP_EXTRA = "zero_lab.json"
_DCP_NAME = re.compile(r"step_(\d+)\.dcp")


def find_any(path: str | Path) -> Path | None:
    """The checkpoint ``path`` names (any format): itself, else the newest step among the run's
    (``path`` a run dir or its ``checkpoints/``); ``None`` when there is no complete one."""
    found = [p for p in (find_checkpoint(path), _latest_dcp(path)) if p is not None]
    if len(found) == 2 and Path(path) in found:
        return Path(path)
    return max(found, key=step_of_any, default=None)


def step_of_any(path: str | Path) -> int | None:
    """The step in a checkpoint's name, any format (``None``: not a checkpoint's name)."""
    return _dcp_step(path) if is_dcp(path) else checkpoint_step(path)


def is_dcp(path: str | Path) -> bool:
    """A complete ``step_N.dcp`` directory."""
    path = Path(path)
    return path.is_dir() and _DCP_NAME.fullmatch(path.name) is not None and (path / DCP_EXTRA).is_file()


def all_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints of every format directly under ``root``, oldest step first."""
    return sorted([*checkpoints(root), *_dcp_checkpoints(root)], key=lambda p: step_of_any(p) or 0)


def _dcp_checkpoints(root: Path) -> list[Path]:
    """The complete DCP checkpoints directly under ``root``, oldest step first."""
    return sorted((p for p in root.glob("step_*.dcp") if is_dcp(p)), key=_dcp_step) if root.is_dir() else []


def _dcp_step(path: str | Path) -> int | None:
    match = _DCP_NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def _latest_dcp(path: str | Path) -> Path | None:
    """``path`` itself when it is one, else the newest under ``<path>/checkpoints`` or ``<path>``."""
    path = Path(path)
    if is_dcp(path):
        return path
    found = _dcp_checkpoints(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
    return found[-1] if found else None
