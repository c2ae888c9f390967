"""Checkpoints in the run dir, and finding them again for ``resume=``.

Two layouts under ``<run dir>/checkpoints/``, named by the next step to run:

* ``step_NNNNNNNN/`` — ZeRO optimizers: the core's **sharded** format
  (:mod:`zero_lab.checkpoint`): every rank writes only its own shard, rank 0 the model
  and a manifest; a directory becomes visible only when complete. ``extra`` holds the
  app's ``step``, ``losses`` and ``world_size``.
* ``step_NNNNNNNN.pt`` — plain optimizers (every rank holds the full state): one
  ``torch.save`` by rank 0 of ``{"format", "step", "model", "optimizer", "losses", "rng",
  "world_size", "zero"}``, written to ``.tmp``, fsynced, ``os.replace``\\ d into place.

Either loads into either kind of optimizer at any world size: the sharded format reshards
by element ranges (plain optimizers get it through ``export_plain_state_dict``), and a
plain state loads into ``ZeroRedundancyOptimizer.load_state_dict``. The loop reseeds from
``(seed, rank, step)`` every step, so the step number is all the RNG a resume needs.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from zero_lab import checkpoint as sharded
from zero_lab.app.build import Training

__all__ = ["checkpoint_step", "find_checkpoint", "restore", "save", "save_atomic"]

FORMAT = 1
_NAME = re.compile(r"step_(\d+)(\.pt)?")


def checkpoint_path(run_dir: str | Path, step: int, zero: bool) -> Path:
    """``<run_dir>/checkpoints/step_<step>`` (a directory for ZeRO, ``.pt`` otherwise)."""
    return Path(run_dir) / "checkpoints" / (f"step_{step:08d}" + ("" if zero else ".pt"))


def _is_complete(path: Path) -> bool:
    return path.is_file() if path.suffix == ".pt" else (path / sharded.MANIFEST).is_file()


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint ``path`` names: itself, or the latest complete one in ``<path>/checkpoints/``."""
    path = Path(path)
    if path.is_file() or (path / sharded.MANIFEST).is_file():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name)) and _is_complete(p)]
    return max(found)[1] if found else None


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint resumes at, from its name (no loading)."""
    match = _NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


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


def save(training: Training, run_dir: str | Path, next_step: int, losses: list[float]) -> Path:
    """Write the checkpoint of ``next_step``. Call on every rank (collective for ZeRO)."""
    path = checkpoint_path(run_dir, next_step, training.zero)
    world = torch.distributed.get_world_size()
    if training.zero:
        extra = {"step": next_step, "losses": list(losses), "world_size": world}
        return sharded.save_checkpoint(path, training.optimizer, training.model, extra=extra)  # type: ignore[arg-type]
    if torch.distributed.get_rank() == 0:
        state = {
            "format": FORMAT,
            "step": next_step,
            "model": {k: v.detach().cpu().clone() for k, v in training.model.state_dict().items()},
            "optimizer": training.optimizer.state_dict(),
            "losses": list(losses),
            "rng": torch.get_rng_state(),
            "world_size": world,
            "zero": False,
        }
        save_atomic(state, path)
    return path


def restore(training: Training, path: str | Path) -> tuple[int, list[float], Path]:
    """Load the checkpoint ``path`` names into this rank; returns ``(step, losses, file)``."""
    found = find_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint found at {path}")
    if found.is_dir():
        return (*_restore_sharded(training, found), found)
    state = torch.load(found, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{found} is not a zero_lab app checkpoint (format {FORMAT})")
    training.model.load_state_dict(state["model"])
    training.optimizer.load_state_dict(state["optimizer"])
    return state["step"], list(state["losses"])[: state["step"]], found


def _restore_sharded(training: Training, directory: Path) -> tuple[int, list[float]]:
    if training.zero:
        extra = sharded.load_checkpoint(directory, training.optimizer, training.model)  # type: ignore[arg-type]
    else:  # a plain optimizer takes the whole state, merged from the shards
        extra = sharded.read_manifest(directory)["extra"]
        training.model.load_state_dict(torch.load(directory / "model.pt", map_location="cpu", weights_only=True))
        with tempfile.TemporaryDirectory() as tmp:
            plain = sharded.export_plain_state_dict(directory, Path(tmp) / "optim.pt")
            training.optimizer.load_state_dict(torch.load(plain, map_location="cpu", weights_only=True))
    return extra["step"], list(extra["losses"])[: extra["step"]]
