"""The app's ``checkpoint_format=dcp``: checkpoints in torch's Distributed Checkpoint format.

``<run dir>/checkpoints/step_NNNNNNNN.dcp/`` holds what ``torch.distributed.checkpoint.save`` writes
for ``{"model": ..., "optim": ...}`` (the optimizer as :func:`zero_lab.dcp.get_optimizer_state_dict`
gives it: torch's format, whole tensors keyed by FQN), so torchtitan, FSDP2 or a plain DDP script
reads it with torch's own functions, and the app resumes it at any world size, ZeRO or plain. Rank 0
adds ``zero_lab.json`` (the app's record) and, last, ``files.sha256.json`` (every file's size and
sha256: :mod:`zero_lab.dcp_record`). Every rank writes into a hidden ``.step_N.dcp.partial-<token>``;
rank 0 renames it into place after a barrier, so a visible one is complete. A resume reads it through
:func:`zero_lab.dcp.load` (restricted unpickling, every file checked against the record), after the
job's check (:mod:`zero_lab.app.check.dcp_resume`) has read its files and metadata.

    save(training, path, extra)          # every rank
    extra = read_extra(path)             # the JSON, before anything is loaded
    load(training, path, load_optimizer=True)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch.distributed as dist

from zero_lab import dcp as zero_dcp
from zero_lab.app.run.training import Training
from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_record import write_record

# torch.distributed.checkpoint itself is imported where a checkpoint is written or read: the config
# check (schema, validate) finds checkpoints through this module and should not pay for it.

__all__ = ["EXTRA", "SUFFIX", "checkpoints", "is_dcp", "latest", "load", "prune", "read_extra", "save"]

SUFFIX = ".dcp"
EXTRA = "zero_lab.json"  # written last: its presence marks a complete checkpoint
_NAME = re.compile(r"step_(\d+)\.dcp")


def is_dcp(path: str | Path) -> bool:
    """A complete ``step_N.dcp`` directory."""
    path = Path(path)
    return path.is_dir() and _NAME.fullmatch(path.name) is not None and (path / EXTRA).is_file()


def checkpoints(root: str | Path) -> list[Path]:
    """The complete DCP checkpoints directly under ``root``, oldest step first."""
    root = Path(root)
    found = [p for p in root.glob(f"step_*{SUFFIX}") if is_dcp(p)] if root.is_dir() else []
    return sorted(found, key=lambda p: int(_NAME.fullmatch(p.name).group(1)))  # type: ignore[union-attr]


def latest(path: str | Path) -> Path | None:
    """``path`` itself when it is one, else the newest under ``<path>/checkpoints`` or ``<path>``."""
    path = Path(path)
    if is_dcp(path):
        return path
    found = checkpoints(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
    return found[-1] if found else None


def step_of(path: str | Path) -> int:
    """The step in a ``step_N.dcp`` name (a ``CheckpointError`` for any other name)."""
    match = _NAME.fullmatch(Path(path).name)
    if match is None:
        raise CheckpointError(f"{path} is not named step_<N>{SUFFIX}")
    return int(match.group(1))


def _state(training: Training) -> dict[str, Any]:
    """What DCP saves, and the template it loads into (every rank; collective for ZeRO)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {
        "model": get_model_state_dict(training.model),
        "optim": zero_dcp.get_optimizer_state_dict(training.model, training.optimizer),
    }


def save(training: Training, path: Path, extra: dict[str, Any]) -> Path:
    """Write ``path`` (``.../step_N.dcp``) on every rank; rank 0 adds ``extra`` as JSON and renames it in place."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    token = [uuid.uuid4().hex[:8] if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    partial = path.with_name(f".{path.name}.partial-{token[0]}")
    dcp.save(_state(training), checkpoint_id=str(partial))  # collective: plans, writes, then metadata
    dist.barrier()
    if rank == 0:
        (partial / EXTRA).write_text(json.dumps(extra))
        write_record(partial)  # last: the size and sha256 of every file above
        if path.exists():
            shutil.rmtree(path)
        os.replace(partial, path)
    dist.barrier()
    return path


def read_extra(path: Path) -> dict[str, Any]:
    """The app's record of a DCP checkpoint (``zero_lab.json``)."""
    try:
        return json.loads((path / EXTRA).read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path / EXTRA}: cannot read the checkpoint's record ({error})") from error


def load(training: Training, path: Path, load_optimizer: bool) -> None:
    """Load the model (and the optimizer) from ``path`` into this rank; call on every rank."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    state = _state(training)
    if not load_optimizer:
        state.pop("optim")
    zero_dcp.load(state, path)
    set_model_state_dict(training.model, state["model"])
    if load_optimizer:
        zero_dcp.set_optimizer_state_dict(training.model, training.optimizer, state["optim"])


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest DCP checkpoints under ``root`` (hidden first, then removed)."""
    doomed = checkpoints(root)[:-keep] if keep > 0 else []
    for path in doomed:
        hidden = path.with_name(f".{path.name}.pruned-{uuid.uuid4().hex[:8]}")
        os.replace(path, hidden)
        shutil.rmtree(hidden, ignore_errors=True)
    return doomed
