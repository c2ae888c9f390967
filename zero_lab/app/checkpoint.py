"""Atomic, consolidated checkpoints in the run dir, and finding them again for ``resume=``.

Format (one ``torch.save`` file, loadable with ``weights_only=True``)::

    {"step": next step to run, "model": state_dict, "optimizer": plain torch.optim state,
     "losses": [loss of every step so far], "rng": torch CPU RNG state of rank 0,
     "world_size": W, "zero": bool, "format": 1}

ZeRO's state is consolidated on rank 0 (``consolidate_state_dict(0)`` +
``state_dict()``) into the plain optimizer format, so a checkpoint loads into any world
size and into plain or ZeRO optimizers alike. A sharded format (each rank writes its own
shard) comes with the core's resharding work.

A write goes to ``<name>.tmp``, is flushed and fsynced, then ``os.replace``\\ d into
place, and the directory is fsynced: a crash leaves the previous checkpoint intact and
never a half-written ``step_*.pt``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer

from zero_lab.app.build import Training

__all__ = ["checkpoint_path", "find_checkpoint", "gather_checkpoint", "load_checkpoint", "save_atomic"]

FORMAT = 1
_NAME = re.compile(r"step_(\d+)\.pt")


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """``<run_dir>/checkpoints/step_<step>.pt`` where ``step`` is the next step to run."""
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}.pt"


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint ``path`` names: the file itself, or the latest under ``<dir>/checkpoints/``."""
    path = Path(path)
    if path.is_file():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name))]
    return max(found)[1] if found else None


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to a temp file, fsync, rename over ``path``, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def gather_checkpoint(training: Training, step: int, losses: list[float], rank: int) -> dict[str, Any] | None:
    """The full checkpoint on rank 0 (``None`` elsewhere). Collective for ZeRO: call on every rank."""
    optimizer: Optimizer = training.optimizer
    if training.zero:
        optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
    if rank != 0:
        return None
    model_state = {k: v.detach().cpu().clone() for k, v in training.model.state_dict().items()}
    return {
        "format": FORMAT,
        "step": step,
        "model": model_state,
        "optimizer": optimizer.state_dict(),
        "losses": list(losses),
        "rng": torch.get_rng_state(),
        "world_size": torch.distributed.get_world_size(),
        "zero": training.zero,
    }


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint on CPU; fails clearly on files that are not zero_lab checkpoints."""
    found = find_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint found at {path}")
    state = torch.load(found, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{found} is not a zero_lab checkpoint (format {FORMAT})")
    state["path"] = str(found)
    return state


def restore(training: Training, state: dict[str, Any]) -> None:
    """Load model and optimizer state on this rank (every rank, the same full state)."""
    training.model.load_state_dict(state["model"])
    training.optimizer.load_state_dict(state["optimizer"])
