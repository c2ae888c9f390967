"""A DCP storage reader that unpickles nothing but data: checked files, restricted pickles.

torch's ``FileSystemReader`` reads a checkpoint's ``.metadata`` with ``pickle.load`` and hands
every non-tensor value of the ``.distcp`` files (an optimizer's ``lr``, ``betas``...) to the
planner, whose ``load_bytes`` calls ``torch.load(weights_only=False)``: a downloaded checkpoint
can run any code on every rank. :func:`checked_reader` makes one with :class:`CheckedReading`
mixed in (subclassing it: a public DCP extension point), which changes three things:

1. ``.metadata`` (and a per-rank ``__<r>.metadata``) is unpickled by :func:`read_metadata_file`:
   ``pickle.Unpickler`` whose ``find_class`` allows only the classes DCP's metadata is made of
   (:data:`METADATA_GLOBALS`, and torch's dtypes). Any other global (``posix.system``, a
   ``builtins.eval``) is refused by name before anything is called — Python's documented way
   of restricting globals; torch's own ``weights_only`` unpickler reads only ``torch.save``
   archives, which ``.metadata`` is not.
2. Each non-tensor value is first loaded with ``torch.load(weights_only=True)``; one that needs
   more than tensors and plain containers is refused by name, so the planner's own unrestricted
   ``torch.load`` only ever sees bytes the restricted one accepted. (Tensors are already read
   ``weights_only`` by torch.)
3. With an integrity record (:mod:`zero_lab.dcp_record`), every file is checked for size and
   sha256 before its first byte is used; a file the metadata names must be a plain name inside
   the checkpoint directory. Each failure is one :class:`~zero_lab.checkpoint.CheckpointError`
   line naming the checkpoint, the file and the cause.

    dcp.load(state, storage_reader=checked_reader(path))
"""

from __future__ import annotations

import dataclasses
import functools
import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.futures import Future

from zero_lab.checkpoint import CheckpointError, load_plain, regular_file_size
from zero_lab.dcp_record import read_record, verify_file

if TYPE_CHECKING:  # torch.distributed.checkpoint takes 1-3 s to import: only where a DCP checkpoint is read
    from torch.distributed.checkpoint import LoadPlan, LoadPlanner, Metadata, ReadItem

__all__ = [
    "METADATA",
    "METADATA_GLOBALS",
    "CheckedReading",
    "cause",
    "check_payload_file",
    "check_value",
    "checked_reader",
    "payload_ends",
    "read_metadata_file",
]

METADATA = ".metadata"  # torch's name for the coordinator's metadata file (``filesystem._metadata_fn``)

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
#: ``(module, name)`` of every global a DCP ``.metadata`` pickle may name: DCP's metadata
#: dataclasses, the storage record FileSystemWriter keeps per item (``_StorageInfo``, a private
#: torch name: it is what the file holds), ``torch.Size``, how a ``torch.layout`` pickles
#: (``torch.serialization._get_layout``, private, likewise) and the path a checkpoint id may be.
#: torch's dtypes (``torch.float32``...) are allowed besides, by kind.
METADATA_GLOBALS = frozenset(
    {(_DCP_METADATA, name) for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                        "ChunkStorageMetadata", "TensorProperties", "StorageMeta", "MetadataIndex",
                                        "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
       ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}
    | {(module, name) for module in ("pathlib", "pathlib._local")
       for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path")}
)  # fmt: skip


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`METADATA_GLOBALS` and torch's dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refused the global {module}.{name}")


def read_metadata_file(path: str | Path) -> Metadata:
    """Unpickle one DCP metadata file with :class:`_MetadataUnpickler`; every failure is one
    :class:`CheckpointError` naming the checkpoint and the file (missing, refused global,
    truncated or not a pickle, not DCP metadata)."""
    path = Path(path)
    where = f"checkpoint {path.parent}: {path.name}"
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except FileNotFoundError:
        raise CheckpointError(
            f"{where} is missing: this is not a complete DCP checkpoint (its writer did not finish, or the file "
            "was deleted)"
        ) from None
    except pickle.UnpicklingError as error:
        if str(error).startswith("refused the global "):
            raise CheckpointError(
                f"{where}: {error}; a DCP metadata file holds only torch.distributed.checkpoint's metadata classes, "
                "so this one was not written by DCP or was tampered with: nothing of it was run"
            ) from None
        raise CheckpointError(f"{where}: cannot read it, the file is truncated or corrupt ({error})") from error
    except Exception as error:  # a broken pickle raises EOFError, ValueError, TypeError...
        raise CheckpointError(f"{where}: cannot read it, the file is truncated or corrupt ({cause(error)})") from error
    from torch.distributed.checkpoint import Metadata

    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointError(f"{where}: holds a {type(metadata).__name__}, not DCP metadata; it was not written by "
                              "torch.distributed.checkpoint")  # fmt: skip
    return metadata


def check_payload_file(directory: Path, name: Any, end: int) -> Path:
    """``directory / name`` for a file the metadata names: a plain name (no path), there, and at
    least ``end`` bytes long (the last byte the metadata places in it); else one line naming it."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise CheckpointError(
            f"checkpoint {directory}: {METADATA} names the file {name!r}, which is not a file in the checkpoint's "
            "directory; it was tampered with"
        )
    path = directory / name
    if not path.exists():
        raise CheckpointError(f"checkpoint {directory}: {name} is missing ({METADATA} places {end} bytes in it); "
                              "restore the file from a good copy")  # fmt: skip
    size = regular_file_size(path)
    if size < end:
        raise CheckpointError(
            f"checkpoint {directory}: {name} is truncated: it has {size} bytes, {METADATA} places data up to byte "
            f"{end}; restore the file from a good copy"
        )
    return path


def payload_ends(storage_data: Any) -> dict[Any, int]:
    """``{file name: the last byte the metadata places in it}`` from a DCP metadata's ``storage_data``."""
    ends: dict[Any, int] = {}
    for info in (storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        ends[name] = max(ends.get(name, 0), int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0)))
    return ends


def cause(error: BaseException) -> str:
    """``Type: first sentence`` of an error's message: torch's end in paragraphs of advice."""
    text = (str(error).strip().splitlines() or [""])[0].split(". ")[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def check_value(data: bytes, where: str) -> None:
    """Raise unless ``data`` loads with ``torch.load(weights_only=True)`` (naming a refused global):
    the native format's loader, :func:`zero_lab.checkpoint.load_plain`, on the value's bytes."""
    load_plain(io.BytesIO(data), where)


class _WeightsOnlyBytes:
    """The planner as ``FileSystemReader.read_data`` uses it, with every non-tensor value checked
    by :func:`check_value` before the planner's own ``load_bytes`` reads it."""

    def __init__(self, planner: LoadPlanner, where: Callable[[ReadItem], str]):
        self.planner, self.where = planner, where

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        check_value(value.getvalue(), self.where(read_item))
        value.seek(0)
        self.planner.load_bytes(read_item, value)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self.planner.resolve_tensor(read_item)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        self.planner.commit_tensor(read_item, tensor)


def checked_reader(path: str | Path) -> CheckedReading:
    """A ``FileSystemReader`` of ``path`` with :class:`CheckedReading`'s checks (module docstring).
    The class is made on the first call, so importing this module does not import
    ``torch.distributed.checkpoint`` (a job's config check imports it and reads no checkpoint)."""
    return _checked_reader_class()(path)


@functools.cache
def _checked_reader_class() -> type[CheckedReading]:
    from torch.distributed.checkpoint import FileSystemReader

    return type("CheckedReader", (CheckedReading, FileSystemReader), {"__doc__": CheckedReading.__doc__})


class CheckedReading:
    """What makes a ``FileSystemReader`` safe for untrusted directories (module docstring), mixed in
    before it (:func:`checked_reader`): restricted unpickling, weights-only values, and each file
    checked against the integrity record when there is one."""

    load_id: str
    storage_data: dict[Any, Any]

    def __init__(self, path: str | Path):
        super().__init__(path)  # type: ignore[call-arg]  # FileSystemReader's
        self._open(path)

    def _open(self, path: str | Path) -> None:
        self.directory = Path(path)
        self.record = read_record(self.directory)  # None: no record, read unverified
        self._verified: set[str] = set()

    @property
    def verified(self) -> bool:
        """Whether the checkpoint has an integrity record (every file read is checked against it)."""
        return self.record is not None

    def reset(self, checkpoint_id: str | Path | None = None) -> None:
        super().reset(checkpoint_id)  # type: ignore[misc]
        if checkpoint_id:
            self._open(checkpoint_id)

    def _checked(self, name: str, end: int = 0) -> Path:
        """``name`` (a file the metadata names) inside the directory, verified against the record
        when there is one, else there and at least ``end`` bytes long."""
        if name in self._verified:
            return self.directory / name
        check_payload_file(self.directory, name, end)
        if self.record is not None:
            verify_file(self.directory, name, self.record)
        self._verified.add(name)
        return self.directory / name

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        if self.record is not None and name not in self._verified:
            verify_file(self.directory, name, self.record)
            self._verified.add(name)
        metadata = read_metadata_file(self.directory / name)
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _file_of(self, item: ReadItem) -> str:
        # storage_data holds torch's private _StorageInfo per item; relative_path is its file
        return self.storage_data[item.storage_index].relative_path

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """torch's ``read_data``, one file at a time: each file verified first, and a failure
        while reading it (truncated, corrupt, a refused value) named with it."""
        by_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_file.setdefault(self._file_of(item), []).append(item)
        ends = payload_ends(self.storage_data)
        for name, items in by_file.items():
            self._checked(name, ends.get(name, 0))
            where = f"checkpoint {self.directory}: {name}"
            checked = _WeightsOnlyBytes(planner, lambda item, where=where: f"{where} ({item.dest_index.fqn})")
            try:
                super().read_data(dataclasses.replace(plan, items=items), checked).wait()  # type: ignore[misc]
            except CheckpointError:
                raise
            except Exception as error:  # torch.load's and the view's errors for a broken file
                raise CheckpointError(
                    f"{where}: cannot read it, the file is truncated or corrupt ({cause(error)})"
                ) from error
        future: Future[None] = Future()
        future.set_result(None)
        return future
