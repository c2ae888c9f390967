"""Sharded checkpoints: every rank writes only its shard; load at any world size or partitioner.

Layout of one checkpoint (a directory)::

    step_00000100/
        manifest.json          format, step, world size, partitioner, parameters (name,
                               shape, dtype, group), param-group hyperparameters, every
                               file's size and sha256, each optimizer file's shard ranges,
                               and the caller's ``extra`` (e.g. the training step)
        model.pt               the model's state_dict (rank 0; replicas are identical)
        optim-rank00000.pt     rank r's shard states: {param index: (start, stop, state)}

Writing is atomic: files are written to temporary names, fsynced and renamed inside
``.step_00000100.partial``; rank 0 writes the manifest last and renames the directory
into place. A directory without a manifest is never loaded, so a crash, SIGTERM or a
full disk mid-save leaves the previous checkpoint as the latest complete one.

Loading reshards: the saved shards are element ranges of flattened parameters, so a
rank at any new world size / partitioner takes, for each of its new shards, the
intersection with every saved range (:func:`zero_lab.shard_state.reslice`), reading
only the files that overlap it. Everything is read with ``weights_only=True``; sizes
and checksums are checked first, so a truncated or corrupt file is a clear
:class:`CheckpointError`, not a crash deep in ``torch.load``.

Why not ``torch.distributed.checkpoint``: it reshards DTensor/ShardedTensor state laid
out on a device mesh; zero_lab's shards are element ranges chosen by pluggable
partitioners, and range intersection over plain files does the resharding (whole ↔
flat included) in a few lines, with files a person can open with ``torch.load``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zero_lab.optimizer import ZeroRedundancyOptimizer
from zero_lab.shard_state import reslice, restrict_state

__all__ = [
    "FORMAT",
    "CheckpointError",
    "export_plain_state_dict",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

FORMAT = "zero_lab.sharded/1"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or does not fit the model."""


# ---------------------------------------------------------------------------- files
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Any) -> None:
    """``write(file)`` into a temporary sibling, fsync, rename over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _swap_into_place(partial: Path, final: Path) -> None:
    """Rename the finished ``partial`` directory to ``final``. An older ``final`` (a run
    re-saving a step) is first renamed aside and deleted only after the swap, so at every
    instant one complete copy carries the name or sits beside it."""
    stale = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
    os.replace(partial, final)
    _fsync_dir(final.parent)
    shutil.rmtree(stale, ignore_errors=True)


def _digest(path: Path) -> dict[str, Any]:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return {"bytes": path.stat().st_size, "sha256": sha.hexdigest()}


def _verified_load(directory: Path, name: str, manifest: dict[str, Any]) -> Any:
    path = directory / name
    expected = manifest["files"].get(name)
    if expected is None or not path.exists():
        raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
    found = _digest(path)
    if (found["bytes"], found["sha256"]) != (expected["bytes"], expected["sha256"]):
        raise CheckpointError(
            f"checkpoint {directory} is corrupt: {name} has {found['bytes']} bytes (sha256 {found['sha256'][:12]}…), "
            f"the manifest says {expected['bytes']} bytes (sha256 {expected['sha256'][:12]}…)"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a bad file
        raise CheckpointError(f"checkpoint {directory}: cannot read {name}: {error}") from error


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint, or a :class:`CheckpointError` saying what is wrong."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise CheckpointError(f"{directory} is not a complete zero_lab checkpoint (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is unreadable: {error}") from error
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} has format {manifest.get('format')!r}; this zero_lab reads {FORMAT!r}")
    return manifest


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint (``step_N`` with a manifest) with the highest N under ``root``."""
    root = Path(root)
    if not root.is_dir():
        return None
    complete = [
        (int(match.group(1)), child)
        for child in root.iterdir()
        if (match := _STEP_DIR.match(child.name)) and (child / MANIFEST).exists()
    ]
    return max(complete)[1] if complete else None


# ---------------------------------------------------------------------------- save
def _param_table(optimizer: ZeroRedundancyOptimizer) -> list[dict[str, Any]]:
    table = []
    for group_index, group in enumerate(optimizer.param_groups):
        names = group.get("param_names", [None] * len(group["params"]))
        for param, name in zip(group["params"], names):
            table.append({"name": name, "shape": list(param.shape), "dtype": str(param.dtype), "group": group_index})
    return table


def _hyperparameters(optimizer: ZeroRedundancyOptimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k not in ("params", "param_names")} for g in optimizer.param_groups]


def save_checkpoint(
    directory: str | Path,
    optimizer: ZeroRedundancyOptimizer,
    model: nn.Module | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a sharded checkpoint to ``directory`` (e.g. ``run/checkpoints/step_00000100``).

    Collective: call on every rank. Returns the final directory.
    """
    final = Path(directory)
    partial = final.with_name(f".{final.name}.partial")
    optimizer.wait_for_exchange()  # model.state_dict() below reads the parameters
    comm, rank = optimizer.communicator, optimizer.rank
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    comm.barrier()

    mine = f"optim-rank{rank:05d}.pt"
    shards = optimizer.local_shard_states()
    _write_atomic(partial / mine, lambda f: torch.save({"shards": shards}, f))
    written = {mine: {**_digest(partial / mine), "ranges": [[i, a, b] for i, (a, b, _) in sorted(shards.items())]}}
    if rank == 0 and model is not None:
        _write_atomic(partial / "model.pt", lambda f: torch.save(model.state_dict(), f))
        written["model.pt"] = _digest(partial / "model.pt")
    everyone = comm.gather_objects(written, to=0, device=optimizer.join_device)

    if rank == 0:
        assert everyone is not None
        files = {name: info for part in everyone for name, info in part.items()}
        manifest = {
            "format": FORMAT,
            "world_size": optimizer.world_size,
            "partitioner": repr(optimizer.partitioner),
            "params": _param_table(optimizer),
            "param_groups": _hyperparameters(optimizer),
            "files": files,
            "extra": extra or {},
        }
        _write_atomic(partial / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1, default=str).encode()))
        _fsync_dir(partial)
        _swap_into_place(partial, final)
    comm.barrier()
    return final


# ---------------------------------------------------------------------------- load
def _check_fits(manifest: dict[str, Any], optimizer: ZeroRedundancyOptimizer, directory: Path) -> None:
    saved = [(p["shape"], p["group"]) for p in manifest["params"]]
    ours = [(p["shape"], p["group"]) for p in _param_table(optimizer)]
    if saved != ours:
        first = next((i for i, (a, b) in enumerate(zip(saved, ours)) if a != b), min(len(saved), len(ours)))
        raise CheckpointError(
            f"checkpoint {directory} does not fit this model: it has {len(saved)} parameters, this optimizer "
            f"{len(ours)}; the first difference is parameter #{first} "
            f"(saved {saved[first] if first < len(saved) else None}, here {ours[first] if first < len(ours) else None})"
        )


def _optimizer_files(manifest: dict[str, Any]) -> Iterator[tuple[str, list[tuple[int, int, int]]]]:
    for name, info in sorted(manifest["files"].items()):
        if name.startswith("optim-rank"):
            yield name, [tuple(r) for r in info["ranges"]]


def load_checkpoint(
    directory: str | Path, optimizer: ZeroRedundancyOptimizer, model: nn.Module | None = None
) -> dict[str, Any]:
    """Load a checkpoint saved at any world size / partitioner into ``optimizer`` (and ``model``).

    Each rank reads only the optimizer files whose ranges overlap its own shards,
    one file at a time. Returns the manifest's ``extra``.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    _check_fits(manifest, optimizer, directory)
    if model is not None:
        model.load_state_dict(_verified_load(directory, "model.pt", manifest))

    params = optimizer.all_params
    wanted = {s.param: (s.start, s.stop) for s in optimizer.partition.shards_of(optimizer.rank)}
    pieces: dict[int, list[tuple[tuple[int, int], dict[str, Any]]]] = {}
    for name, ranges in _optimizer_files(manifest):
        if not any(i in wanted and a < wanted[i][1] and wanted[i][0] < b for i, a, b in ranges):
            continue
        saved = _verified_load(directory, name, manifest)["shards"]
        for index, (start, stop, state) in saved.items():
            part = restrict_state(state, (start, stop), params[index].shape, wanted[index]) if index in wanted else None
            if part is not None:
                pieces.setdefault(index, []).append(part)
        del saved

    def state_of(index: int, start: int, stop: int) -> dict[str, Any] | None:
        return reslice(pieces[index], params[index].shape, (start, stop)) if index in pieces else None

    optimizer.load_shard_states(state_of, manifest["param_groups"])
    return manifest["extra"]


# ---------------------------------------------------------------------------- export
def export_plain_state_dict(directory: str | Path, out_path: str | Path) -> Path:
    """Write the checkpoint's optimizer state as one plain ``torch.optim`` state dict file.

    No process group needed. Shard files are memory-mapped (``mmap=True``), so resident
    memory is bounded by the parameters cut across ranks, not by the whole state.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    shapes = [p["shape"] for p in manifest["params"]]
    pieces: dict[int, list[tuple[tuple[int, int], dict[str, Any]]]] = {}
    for name, _ in _optimizer_files(manifest):
        _verified_load(directory, name, manifest)  # size, checksum and format check
        saved = torch.load(directory / name, map_location="cpu", weights_only=True, mmap=True)["shards"]
        for index, (start, stop, state) in saved.items():
            pieces.setdefault(index, []).append(((start, stop), state))
    state = {}
    for index in sorted(pieces):
        numel = 1
        for size in shapes[index]:
            numel *= size
        merged = reslice(pieces[index], shapes[index], (0, numel))
        if merged is not None:
            state[index] = merged
    groups, offset = [], 0
    for group_index, hyper in enumerate(manifest["param_groups"]):
        members = [i for i, p in enumerate(manifest["params"]) if p["group"] == group_index]
        groups.append({**hyper, "params": list(range(offset, offset + len(members)))})
        offset += len(members)
    out_path = Path(out_path)
    _write_atomic(out_path, lambda f: torch.save({"state": state, "param_groups": groups}, f))
    return out_path
