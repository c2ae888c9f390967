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
``.step_00000100.partial-<token>`` (a token rank 0 draws and broadcasts, so a concurrent
writer of the same step never shares it); rank 0 writes the manifest last and renames
the directory into place. A directory without a manifest is never loaded, so a crash,
SIGTERM or a full disk mid-save leaves the previous checkpoint as the latest complete one.

Loading reshards: the saved shards are element ranges of flattened parameters, so a
rank at any new world size / partitioner takes, for each of its new shards, the
intersection with every saved range (:func:`zero_lab.shard_state.reslice`), reading
only the files that overlap it. Everything is read with ``weights_only=True``; sizes
and checksums are checked first, and the manifest must list every rank's file with
ranges that tile each parameter, so a truncated, corrupt or missing file is a clear
:class:`CheckpointError`, not a crash deep in ``torch.load`` or silently fresh state.

Both layouts of the app (these directories, and the plain optimizers' ``step_N.pt``
files) are found by one function, :func:`latest_checkpoint`, and pruned by
:func:`prune_checkpoints`.

Why not ``torch.distributed.checkpoint``: it reshards DTensor/ShardedTensor state laid
out on a device mesh; zero_lab's shards are element ranges chosen by pluggable
partitioners, and range intersection over plain files does the resharding (whole ↔
flat included) in a few lines, with files a person can open with ``torch.load``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import pickle
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from zero_lab.chained import GROUP_CLASS_KEY, NOT_HYPERPARAMETERS, canonical_class_path, class_path
from zero_lab.comm import Communicator
from zero_lab.elementwise import is_elementwise
from zero_lab.files import fsync_dir, write_atomic, write_json
from zero_lab.shard_state import reslice, restrict_state
from zero_lab.state_probe import expected_state, state_problem

__all__ = [
    "FORMAT",
    "CheckpointError",
    "ShardedStates",
    "check_digest",
    "check_saved_states",
    "check_state_dict",
    "checkpoint_step",
    "checkpoints",
    "digest_path",
    "export_plain_state_dict",
    "file_digest",
    "find_checkpoint",
    "hyperparameters",
    "is_complete",
    "latest_checkpoint",
    "load_checked_file",
    "load_checkpoint",
    "load_file",
    "load_verified",
    "prune_checkpoints",
    "read_manifest",
    "refused_global",
    "remove_checkpoint",
    "save_checkpoint",
    "save_file",
    "save_tensors",
]

FORMAT = "zero_lab.sharded/1"
MANIFEST = "manifest.json"
_STEP_NAME = re.compile(r"step_(\d+)(\.pt)?")  # sharded directories; ``.pt``: the app's plain-optimizer files
_SWAP_TRIES = 10


class ShardedStates(Protocol):
    """What a sharded checkpoint reads and writes of an optimizer: a
    :class:`~zero_lab.ZeroRedundancyOptimizer`, or the engine's
    :class:`~zero_lab.engine.state.EngineStates` (``engine.states()``)."""

    rank: int
    world_size: int
    partitioner: Any
    optim: Any
    param_groups: list[dict[str, Any]]
    all_params: list[torch.Tensor]
    partition: Any  # ``shards_of(rank)``: this rank's ranges (``.param``, ``.start``, ``.stop``)
    communicator: Communicator
    replica_communicator: Communicator | None  # shard groups: the ranks holding the same shards elsewhere
    hierarchy: Any  # ``.group_index``: which shard group this rank is in

    @property
    def join_device(self) -> torch.device: ...

    def wait_for_exchange(self) -> None: ...

    def group_classes(self) -> list[type[torch.optim.Optimizer]]: ...

    def local_shard_states(self) -> dict[int, tuple[int, int, dict[str, Any]]]: ...

    def load_shard_states(
        self, state_of: Callable[[int, int, int], dict[str, Any] | None], groups: list[dict[str, Any]]
    ) -> None: ...


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or does not fit the model."""


# ---------------------------------------------------------------------------- files
def _swap_into_place(partial: Path, final: Path, token: str) -> None:
    """Rename the finished ``partial`` directory to ``final``. An older ``final`` (a run
    re-saving a step, or a concurrent writer that got there first) is first renamed aside
    to a name private to this writer and deleted only after the swap, so at every instant
    one complete copy carries the name or sits beside it. Each try moves aside to a name of its
    own (``.<final>.old-<token>-<try>``): a second try renaming onto the first's copy, a
    non-empty directory, failed with ENOTEMPTY while two writers raced."""
    stale_copies = []
    for attempt in range(_SWAP_TRIES):
        stale = final.with_name(f".{final.name}.old-{token}-{attempt}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(final, stale)
            stale_copies.append(stale)
        try:
            os.replace(partial, final)
            break
        except OSError as error:  # another writer published in between: move theirs aside too
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    else:
        raise CheckpointError(f"could not publish {final}: another writer kept replacing it")
    fsync_dir(final.parent)
    for stale in stale_copies:
        shutil.rmtree(stale, ignore_errors=True)


def file_digest(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of one file, read in 1 MiB blocks."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return {"bytes": path.stat().st_size, "sha256": sha.hexdigest()}


#: A manifest or a size/sha256 record larger than this is not one zero_lab wrote.
MANIFEST_LIMIT_BYTES = 64 << 20
#: Keys every manifest has (:func:`save_checkpoint` writes them all).
MANIFEST_KEYS = ("format", "world_size", GROUP_CLASS_KEY, "partitioner", "params", "param_groups", "files", "extra")


def regular_file_size(path: Path) -> int:
    """The size of ``path`` if it is a regular file (a symlink to one is fine); a
    :class:`CheckpointError` for a FIFO, a device, a directory or a socket, where a read
    could block forever or never end."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read it ({error.strerror or error})") from error
    if not stat.S_ISREG(info.st_mode):
        kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
        kind = next((name for test, name in kinds if test(info.st_mode)), "not a regular file")
        raise CheckpointError(f"{path}: is {kind}, not a regular file; checkpoints are read from regular files only")
    return info.st_size


def read_json_file(path: Path, what: str) -> Any:
    """A small JSON file (a manifest, a size/sha256 record), read with bounds: a regular file
    of at most :data:`MANIFEST_LIMIT_BYTES`, valid UTF-8 JSON; else a :class:`CheckpointError`
    naming it."""
    size = regular_file_size(path)
    if size > MANIFEST_LIMIT_BYTES:
        raise CheckpointError(f"{path}: {size} bytes is more than any {what} zero_lab writes ({MANIFEST_LIMIT_BYTES})")
    with open(path, "rb") as handle:
        data = handle.read(MANIFEST_LIMIT_BYTES + 1)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"{path}: the {what} is not valid UTF-8 JSON ({type(error).__name__}: {error})"
        ) from error


def check_digest(path: Path, expected: dict[str, Any], subject: str, source: str) -> None:
    """Raise unless ``path`` has the size and sha256 that ``source`` (its record) gives; the
    size (and that it is a regular file) is checked before a byte is hashed."""
    size = regular_file_size(path)
    if size != expected.get("bytes"):
        raise CheckpointError(
            f"{subject} is corrupt: {path.name} has {size} bytes, {source} says {expected.get('bytes')} bytes"
        )
    found = file_digest(path)
    if (found["bytes"], found["sha256"]) != (expected.get("bytes"), expected.get("sha256")):
        raise CheckpointError(
            f"{subject} is corrupt: {path.name} has {found['bytes']} bytes (sha256 {found['sha256'][:12]}…), "
            f"{source} says {expected.get('bytes')} bytes (sha256 {str(expected.get('sha256'))[:12]}…)"
        )


# torch's two wordings: a global not allowed, and one of a blocked module (``posix.system``)
_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")


def refused_global(error: pickle.UnpicklingError) -> str | None:
    """The global ``torch.load(weights_only=True)`` refused (``posix.system``), if it says so."""
    found = _REFUSED_GLOBAL.search(str(error))
    return found.group(1) if found else None


def load_file(path: str | Path, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on CPU, every failure one :class:`CheckpointError`
    line naming the file (:func:`load_plain`)."""
    return load_plain(Path(path), str(path), mmap=mmap)


def load_plain(source: Path | io.BytesIO, where: str, mmap: bool = False) -> Any:
    """``torch.load(source, weights_only=True)`` on CPU, every failure one :class:`CheckpointError`
    line starting with ``where``: a refused pickle global is named (torch's own message ends in a
    documentation link), a truncated or corrupt file says so. The native format's files and DCP's
    non-tensor values (:mod:`zero_lab.dcp_reader`) are read through it."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        refused = refused_global(error)
        what = f"the global {refused}" if refused else "a pickle that is not plain tensors and containers"
        raise CheckpointError(
            f"{where}: refused to load {what} (weights_only=True loads tensors and plain containers only; "
            "a checkpoint that needs more was not written by zero_lab or DCP, or was tampered with)"
        ) from error
    except Exception as error:  # torch raises OSError, RuntimeError, EOFError... for a bad file
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"{where}: cannot read it, the file is truncated or corrupt ({type(error).__name__}: {first})"
        ) from error


def digest_path(path: str | Path) -> Path:
    """The size + sha256 record beside a single-file checkpoint: ``step_N.pt.sha256.json``."""
    path = Path(path)
    return path.with_name(path.name + ".sha256.json")


def save_file(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically, its size and sha256 recorded first in
    :func:`digest_path` (so whenever the file carries its name, its record exists)."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getbuffer()
    with _disk_full_named(path, len(data)):
        write_json(digest_path(path), {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        return write_atomic(path, lambda f: f.write(data))


def _payload_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (nested dicts, lists, tuples): what saving it needs, at least."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(v) for v in obj)
    return 0


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem (``None``: unknown)."""
    try:
        info = os.statvfs(path if path.is_dir() else path.parent)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


@contextlib.contextmanager
def _disk_full_named(path: Path, needed: int) -> Iterator[None]:
    """Turn a write that ran out of space — ``OSError(ENOSPC)``, or torch's zip writer's
    ``unexpected pos`` — into one :class:`CheckpointError` naming the file and the bytes it
    needs. The temporary file is gone (``write_atomic``), so nothing half-written carries a name."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        free = free_bytes(path)
        full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error)
        if not (full or (free is not None and free < needed)):
            raise
        raise CheckpointError(
            f"no space left on device: writing {path} needs at least {needed} bytes, "
            f"{'?' if free is None else free} bytes are free on its filesystem; free some space or save elsewhere "
            "(the previous checkpoint is still the latest complete one)"
        ) from error


def save_tensors(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` atomically to ``path``; a full disk is one :class:`CheckpointError` naming it."""
    path = Path(path)
    with _disk_full_named(path, _payload_bytes(obj)):
        return write_atomic(path, lambda f: torch.save(obj, f))


def load_checked_file(path: str | Path) -> Any:
    """Load a file written by :func:`save_file` after checking its size and sha256."""
    path = Path(path)
    record = digest_path(path)
    try:
        expected = read_json_file(record, "size/sha256 record")
    except CheckpointError as error:
        raise CheckpointError(
            f"{path}: its size/sha256 record {record.name} is missing or unreadable ({error}); copy it with the "
            "checkpoint (zero_lab loads no unchecked checkpoint)"
        ) from error
    if not isinstance(expected, dict):
        raise CheckpointError(f"{record}: the size/sha256 record is not a JSON object")
    check_digest(path, expected, str(path), record.name)
    return load_file(path)


def load_verified(directory: str | Path, name: str, manifest: dict[str, Any], mmap: bool = False) -> Any:
    """Load ``directory/name`` after checking its size and sha256 against the manifest."""
    directory = Path(directory)
    path = directory / name
    expected = manifest["files"].get(name)
    if expected is None or not path.exists():
        raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
    check_digest(path, expected, f"checkpoint {directory}", "the manifest")
    return load_file(path, mmap=mmap)


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint, or a :class:`CheckpointError` saying what is wrong."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise CheckpointError(f"{directory} is not a complete zero_lab checkpoint (no {MANIFEST})")
    manifest = read_json_file(path, "manifest")
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: the manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} has format {manifest.get('format')!r}; this zero_lab reads {FORMAT!r}")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise CheckpointError(f"{path}: the manifest lacks {', '.join(missing)}; it was not written by zero_lab")
    return manifest


def checkpoint_step(path: str | Path) -> int | None:
    """The step in a checkpoint's name (``step_00000100`` or ``step_00000100.pt``), else ``None``."""
    match = _STEP_NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path: str | Path) -> bool:
    """A ``step_N.pt`` file, or a ``step_N`` directory with its manifest (written last)."""
    path = Path(path)
    return path.is_file() if path.suffix == ".pt" else (path / MANIFEST).is_file()


def checkpoints(root: str | Path) -> list[Path]:
    """Every complete checkpoint directly under ``root`` (both layouts), oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(step, child) for child in root.iterdir() if (step := checkpoint_step(child)) is not None]
    return [child for _, child in sorted(found) if is_complete(child)]


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or ``None``."""
    found = checkpoints(root)
    return found[-1] if found else None


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint ``path`` names: itself (a complete directory or a file), else the latest
    complete one in ``<path>/checkpoints/`` (a run dir) or in ``<path>`` (a checkpoints folder)."""
    path = Path(path)
    if path.is_file() or (path / MANIFEST).is_file():
        return path
    return latest_checkpoint(path / "checkpoints" if (path / "checkpoints").is_dir() else path)


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints under ``root``; returns the deleted.

    Each is first renamed to a hidden name, so it stops counting as complete at once.
    """
    doomed = checkpoints(root)[:-keep] if keep > 0 else []
    for path in doomed:
        remove_checkpoint(path)
    return doomed


def remove_checkpoint(path: Path) -> None:
    """Delete one checkpoint (a directory, or a file and its digest): renamed to a hidden name first,
    so it stops counting as complete at once, then removed."""
    hidden = path.with_name(f".{path.name}.pruned-{uuid.uuid4().hex[:8]}")
    os.replace(path, hidden)
    if hidden.is_dir():
        shutil.rmtree(hidden, ignore_errors=True)
    else:
        hidden.unlink(missing_ok=True)
        digest_path(path).unlink(missing_ok=True)


# ---------------------------------------------------------------------------- save
def _agreed_token(optimizer: ShardedStates) -> str:
    """A random hex token drawn on rank 0 and broadcast, the same on every rank."""
    word = torch.tensor([int.from_bytes(os.urandom(7), "little") if optimizer.rank == 0 else 0], dtype=torch.int64)
    word = word.to(optimizer.join_device)
    optimizer.communicator.broadcast_many([(word, 0)], op="checkpoint")
    return f"{int(word.item()):014x}"


def _param_table(optimizer: ShardedStates) -> list[dict[str, Any]]:
    table = []
    for group_index, group in enumerate(optimizer.param_groups):
        names = group.get("param_names", [None] * len(group["params"]))
        for param, name in zip(group["params"], names):
            table.append({"name": name, "shape": list(param.shape), "dtype": str(param.dtype), "group": group_index})
    return table


#: What a manifest leaves out of a param group: all but its hyper-parameters and the class stepping it.
_NOT_RECORDED = tuple(key for key in NOT_HYPERPARAMETERS if key != GROUP_CLASS_KEY)


def hyperparameters(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each param group without its parameters: the hyper-parameters a manifest records (a group's
    ``optimizer_class`` as :func:`~zero_lab.chained.class_path` spells it, whichever way it was given
    or saved)."""
    return [
        {k: canonical_class_path(v) if k == GROUP_CLASS_KEY else v for k, v in g.items() if k not in _NOT_RECORDED}
        for g in groups
    ]


def save_checkpoint(
    directory: str | Path,
    optimizer: ShardedStates,
    model: nn.Module | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a sharded checkpoint to ``directory`` (e.g. ``run/checkpoints/step_00000100``).

    Collective: call on every rank. Returns the final directory. With ``shard_size`` < W the
    other shard groups hold replicas of shard group 0's shards: group 0 writes, they wait for it
    (a barrier on their replica group, which holds one rank of group 0).
    """
    final = Path(directory)
    optimizer.wait_for_exchange()  # model.state_dict() below reads the parameters
    replicas = optimizer.replica_communicator
    if replicas is not None and optimizer.hierarchy.group_index > 0:
        replicas.barrier()  # returns once group 0's rank of this replica group has written and renamed
        return final
    comm, rank = optimizer.communicator, optimizer.rank
    token = _agreed_token(optimizer)  # this save's own partial dir: a concurrent writer never shares it
    partial = final.with_name(f".{final.name}.partial-{token}")
    if rank == 0:
        partial.mkdir(parents=True)
    comm.barrier()

    mine = f"optim-rank{rank:05d}.pt"
    shards = optimizer.local_shard_states()
    save_tensors({"shards": shards}, partial / mine)
    written = {mine: {**file_digest(partial / mine), "ranges": [[i, a, b] for i, (a, b, _) in sorted(shards.items())]}}
    if rank == 0 and model is not None:
        save_tensors(model.state_dict(), partial / "model.pt")
        written["model.pt"] = file_digest(partial / "model.pt")
    everyone = comm.gather_objects(written, to=0, device=optimizer.join_device)

    if rank == 0:
        assert everyone is not None
        files = {name: info for part in everyone for name, info in part.items()}
        manifest = {
            "format": FORMAT,
            "world_size": optimizer.world_size,
            GROUP_CLASS_KEY: class_path(type(optimizer.optim)),
            "partitioner": repr(optimizer.partitioner),
            "params": _param_table(optimizer),
            "param_groups": hyperparameters(optimizer.param_groups),
            "files": files,
            "extra": extra or {},
        }
        write_json(partial / MANIFEST, manifest, indent=1)
        fsync_dir(partial)
        _swap_into_place(partial, final, token)
    comm.barrier()
    if replicas is not None:
        replicas.barrier()  # the other groups' ranks return now: the checkpoint is in place
    return final


# ---------------------------------------------------------------------------- load
def _check_fits(
    manifest: dict[str, Any], optimizer: ShardedStates, directory: Path, model: nn.Module | None = None
) -> None:
    """The saved parameters are this optimizer's (shapes and groups, in order); else name the
    first that differs, by its name where the manifest or ``model`` knows it."""
    saved = [(p["shape"], p["group"]) for p in manifest["params"]]
    table = _param_table(optimizer)
    ours = [(p["shape"], p["group"]) for p in table]
    if saved != ours:
        first = next((i for i, (a, b) in enumerate(zip(saved, ours)) if a != b), min(len(saved), len(ours)))
        name = _param_name(manifest, table, optimizer, model, first)

        def side(entries: list[tuple[Any, int]]) -> str:
            if first >= len(entries):
                return "absent"
            shape, group = entries[first]
            return f"shape {tuple(shape)} in group {group}"

        raise CheckpointError(
            f"checkpoint {directory} does not fit this model: parameter {name} has {side(saved)} in the checkpoint, "
            f"{side(ours)} here ({len(saved)} parameters saved, {len(ours)} here); load it into the model it was "
            "saved from"
        )


def _param_name(
    manifest: dict[str, Any],
    table: list[dict[str, Any]],
    optimizer: ShardedStates,
    model: nn.Module | None,
    index: int,
) -> str:
    """``'layers.0.weight' (#0)``: a parameter's name from the optimizer, the manifest or the model."""
    names = [row["name"] for row in table]
    if model is not None and not any(names):
        by_id = {id(p): n for n, p in model.named_parameters()}
        names = [by_id.get(id(p)) for p in optimizer.all_params]
    saved = manifest["params"][index].get("name") if index < len(manifest["params"]) else None
    name = (names[index] if index < len(names) else None) or saved
    return f"{name!r} (#{index})" if name else f"#{index}"


def _check_coverage(manifest: dict[str, Any], directory: Path) -> None:
    """Every rank's file is listed, and the saved ranges of each parameter tile it exactly
    (no gap, no overlap): a shard removed with its manifest entry is an error, not fresh state."""
    names = {name for name, _ in _optimizer_files(manifest)}
    missing = [f"optim-rank{r:05d}.pt" for r in range(manifest["world_size"]) if f"optim-rank{r:05d}.pt" not in names]
    if missing:
        raise CheckpointError(
            f"checkpoint {directory} is incomplete: saved by {manifest['world_size']} ranks, but the manifest lists "
            f"no {', '.join(missing)}"
        )
    ranges: dict[int, list[tuple[int, int]]] = {}
    for _, saved in _optimizer_files(manifest):
        for index, start, stop in saved:
            ranges.setdefault(index, []).append((start, stop))
    for index, pieces in sorted(ranges.items()):
        numel = math.prod(manifest["params"][index]["shape"])
        covered = 0
        for start, stop in sorted(pieces):
            if start != covered:
                break
            covered = stop
        if covered != numel:
            name = manifest["params"][index]["name"] or f"#{index}"
            raise CheckpointError(
                f"checkpoint {directory} is incomplete: the saved state of parameter {name} covers elements "
                f"{sorted(pieces)} of {numel}"
            )


def check_saved_states(
    file: str,
    saved: dict[int, tuple[int, int, dict[str, Any]]],
    manifest: dict[str, Any],
    optimizer: ShardedStates,
    directory: Path,
    model: nn.Module | None = None,
) -> None:
    """Each saved state in one optimizer file fits what the class stepping its parameter makes:
    the keys it keeps, each tensor's shape and dtype (:func:`zero_lab.state_probe.expected_state`,
    learnt from a step of that class on ``meta`` tensors shaped like the saved piece: the
    parameter's shape for a whole one, 1-D for an element range), under the manifest's
    hyper-parameters of the parameter's group. Element ranges are checked by
    :func:`_check_coverage`; this checks what the ranges hold. The first problem is one
    :class:`CheckpointError` naming the file, the parameter and the key."""
    classes = optimizer.group_classes()
    table = _param_table(optimizer)
    params = optimizer.all_params
    for index, (start, stop, state) in sorted(saved.items()):
        if not (isinstance(index, int) and 0 <= index < len(params)):
            raise CheckpointError(
                f"checkpoint {directory}: {file} holds the state of parameter #{index}, but the checkpoint has "
                f"{len(params)} parameters; it was not written by zero_lab"
            )
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint {directory}: {file} holds a {type(state).__name__} as the state of "
                                  f"parameter #{index}, not a dict; it was not written by zero_lab")  # fmt: skip
        group = table[index]["group"]
        cls = classes[group]
        shape = tuple(params[index].shape)
        whole = (start, stop) == (0, params[index].numel())
        name = _param_name(manifest, table, optimizer, model, index)
        if not whole and not is_elementwise(cls):
            raise CheckpointError(
                f"checkpoint {directory}: {file} holds elements [{start}, {stop}) of parameter {name}, but "
                f"{cls.__name__} steps whole parameters; it was not saved by this optimizer"
            )
        hyper = manifest["param_groups"][group] if group < len(manifest["param_groups"]) else {}
        shard_shape = shape if whole else (stop - start,)
        _check_param_state(f"checkpoint {directory}: {file}", name, state, cls, hyper, shard_shape, params[index].dtype)


def _check_param_state(
    where: str,
    name: str,
    state: dict[str, Any],
    cls: type[torch.optim.Optimizer],
    hyper: dict[str, Any],
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    """Raise :class:`CheckpointError` when one parameter's saved ``state`` lacks a key, or holds a
    tensor of another shape or dtype kind, than ``cls`` makes for ``shape``/``dtype`` under ``hyper``."""
    arguments = {k: v for k, v in hyper.items() if k not in NOT_HYPERPARAMETERS}
    expected = expected_state(cls, arguments, shape, dtype)
    problem = None if expected is None else state_problem(state, expected, cls.__name__)
    if problem is not None:
        raise CheckpointError(
            f"{where}: the saved state of parameter {name} {problem}; the file was not written for this "
            "optimizer or was altered. Restore it from a good copy, or load the model weights only and start "
            "the optimizer state fresh"
        )


def check_state_dict(
    where: str | Path,
    state_dict: dict[str, Any],
    groups: list[list[torch.Tensor]],
    classes: list[type[torch.optim.Optimizer]],
    names: dict[int, str] | None = None,
) -> None:
    """A ``torch.optim`` state dict (a plain optimizer's, or a consolidated ZeRO one) fits the
    parameters it is about to be loaded into, as :func:`check_saved_states` checks a shard
    file: each parameter's state has the keys, shapes and dtypes the class stepping its group
    (``classes[g]``, over the live parameters ``groups[g]``) makes under the saved group's
    hyper-parameters. ``names``: ``{id(param): name}``. Groups whose sizes differ are left to
    ``load_state_dict``, which refuses them."""
    saved_groups = state_dict.get("param_groups", [])
    if [len(g.get("params", [])) for g in saved_groups] != [len(g) for g in groups]:
        return
    states = state_dict.get("state", {})
    position = 0
    for saved, params, cls in zip(saved_groups, groups, classes):
        for key, param in zip(saved["params"], params):
            state = states.get(key)
            label = (names or {}).get(id(param))
            name = f"{label!r} (#{position})" if label else f"#{position}"
            position += 1
            if not isinstance(state, dict):
                continue  # no state: never stepped
            _check_param_state(str(where), name, state, cls, saved, tuple(param.shape), param.dtype)


def _optimizer_files(manifest: dict[str, Any]) -> Iterator[tuple[str, list[tuple[int, int, int]]]]:
    for name, info in sorted(manifest["files"].items()):
        if name.startswith("optim-rank"):
            yield name, [tuple(r) for r in info["ranges"]]


def load_checkpoint(directory: str | Path, optimizer: ShardedStates, model: nn.Module | None = None) -> dict[str, Any]:
    """Load a checkpoint saved at any world size / partitioner into ``optimizer`` (and ``model``).

    Each rank reads only the optimizer files whose ranges overlap its own shards,
    one file at a time. Returns the manifest's ``extra``.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    _check_fits(manifest, optimizer, directory, model)
    _check_coverage(manifest, directory)
    if model is not None:
        model.load_state_dict(load_verified(directory, "model.pt", manifest))

    params = optimizer.all_params
    wanted = {s.param: (s.start, s.stop) for s in optimizer.partition.shards_of(optimizer.rank)}
    pieces: dict[int, list[tuple[tuple[int, int], dict[str, Any]]]] = {}
    for name, ranges in _optimizer_files(manifest):
        if not any(i in wanted and a < wanted[i][1] and wanted[i][0] < b for i, a, b in ranges):
            continue
        saved = load_verified(directory, name, manifest)["shards"]
        check_saved_states(name, saved, manifest, optimizer, directory, model)
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
    _check_coverage(manifest, directory)
    shapes = [p["shape"] for p in manifest["params"]]
    pieces: dict[int, list[tuple[tuple[int, int], dict[str, Any]]]] = {}
    for name, _ in _optimizer_files(manifest):
        saved = load_verified(directory, name, manifest, mmap=True)["shards"]
        for index, (start, stop, state) in saved.items():
            pieces.setdefault(index, []).append(((start, stop), state))
    state = {}
    for index in sorted(pieces):
        merged = reslice(pieces[index], shapes[index], (0, math.prod(shapes[index])))
        if merged is not None:
            state[index] = merged
    groups, offset = [], 0
    for group_index, hyper in enumerate(manifest["param_groups"]):
        members = [i for i, p in enumerate(manifest["params"]) if p["group"] == group_index]
        groups.append({**hyper, "params": list(range(offset, offset + len(members)))})
        offset += len(members)
    out_path = Path(out_path)
    write_atomic(out_path, lambda f: torch.save({"state": state, "param_groups": groups}, f))
    return out_path
