"""A DCP checkpoint checked before anything is loaded: its files, then its fit, from the metadata.

What torch's ``dcp.load`` finds out only while every rank loads (and reports as
``CheckpointException ranks:dict_keys([0])``, the cause in a traceback) is decided here, in
one process, without a process group, reading only the integrity record, ``.metadata`` and
file sizes (every file hashed when there is a record). Each problem is one
:class:`~zero_lab.checkpoint.CheckpointError` line naming the checkpoint, the file and the
cause:

* :func:`check_files` — with an integrity record (:mod:`zero_lab.dcp_record`) every file has
  its recorded size and sha256; ``.metadata`` is there and unpickles with the restricted
  unpickler (:mod:`zero_lab.dcp_reader`); every file it names is there and at least as long as
  the last byte it places in it (a truncated ``__1_0.distcp`` is named even without a record);
  every non-tensor value in them loads ``weights_only`` (a tampered ``lr`` is refused by name).
* :func:`check_fits` — each tensor of a state-dict template (nested dicts, DCP's dotted keys)
  is in the checkpoint with its shape and dtype, and under the ``strict`` top-level keys the
  checkpoint holds nothing the template lacks (``model.head.weight`` in the checkpoint, no
  ``head`` in the model).
* :func:`check_state_names` — every parameter the optimizer state names (``optim.state.<fqn>.*``)
  is one of the model's.

:func:`load_failure` turns what ``dcp.load`` raises anyway into such a line.

    metadata, verified = check_files(path)          # verified: it has an integrity record
    check_fits(path, metadata, {"model": model.state_dict()}, strict=("model",))
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_reader import METADATA, cause, check_payload_file, check_value, payload_ends, read_metadata_file
from zero_lab.dcp_record import RECORD, read_record, verify_all

if TYPE_CHECKING:  # torch.distributed.checkpoint takes 1-3 s to import: only where a DCP checkpoint is read
    from torch.distributed.checkpoint import CheckpointException, Metadata

__all__ = ["check_files", "check_fits", "check_state_names", "flat_tensors", "load_failure"]


def check_files(directory: str | Path) -> tuple[Metadata, bool]:
    """The checkpoint's metadata, after checking its files (module docstring); and whether they
    were verified against an integrity record (``False``: it has none, they were only sized)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory}: no such directory")
    record = read_record(directory)
    if record is not None:
        verify_all(directory, record)
    metadata = read_metadata_file(directory / METADATA)
    for name, end in sorted(payload_ends(metadata.storage_data).items(), key=lambda item: str(item[0])):
        check_payload_file(directory, name, end)
        if record is not None and name not in record:
            raise CheckpointError(f"checkpoint {directory}: {name} is named by {METADATA} but not in its record "
                                  f"({RECORD}); the checkpoint was changed after it was written")  # fmt: skip
    _check_values(directory, metadata)
    return metadata, record is not None


def _check_values(directory: Path, metadata: Metadata) -> None:
    """Every non-tensor value (an optimizer's ``lr``, ``betas``...) loads ``weights_only``
    (:func:`~zero_lab.dcp_reader.check_value`): read from where the metadata places it, a few
    hundred bytes each. One stored through a transform (compression) is left to the reader,
    which checks it after the transform."""
    from torch.distributed.checkpoint import BytesStorageMetadata

    for index, info in (metadata.storage_data or {}).items():
        entry = metadata.state_dict_metadata.get(getattr(index, "fqn", None))
        if not isinstance(entry, BytesStorageMetadata) or getattr(info, "transform_descriptors", None):
            continue
        with open(directory / info.relative_path, "rb") as handle:
            handle.seek(info.offset)
            data = handle.read(info.length)
        check_value(data, f"checkpoint {directory}: {info.relative_path} ({index.fqn})")


def flat_tensors(state: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a nested state dict under DCP's flattened keys (``model.layers.0.weight``)."""
    for key, value in state.items():
        name = f"{prefix}{key}"
        if torch.is_tensor(value):
            yield name, value
        elif isinstance(value, Mapping):
            yield from flat_tensors(value, f"{name}.")
        elif isinstance(value, (list, tuple)):
            yield from flat_tensors({str(i): v for i, v in enumerate(value)}, f"{name}.")


def _shape(size: Sequence[int]) -> str:
    return str(tuple(int(n) for n in size))


def check_fits(
    directory: str | Path, metadata: Metadata, template: Mapping[str, Any], strict: Sequence[str] = ()
) -> None:
    """Every tensor of ``template`` is in the checkpoint, of its shape and dtype; under each
    top-level key in ``strict`` the checkpoint holds no key the template lacks."""
    from torch.distributed.checkpoint import TensorStorageMetadata

    where = f"checkpoint {directory}: {METADATA}"
    saved = metadata.state_dict_metadata
    wanted = dict(flat_tensors(template))
    for key, tensor in wanted.items():
        entry = saved.get(key)
        if entry is None:
            raise CheckpointError(f"{where}: has no {key} (this model's {_shape(tensor.shape)} {tensor.dtype}); load "
                                  "it into the model it was saved from")  # fmt: skip
        if not isinstance(entry, TensorStorageMetadata):
            raise CheckpointError(f"{where}: holds {key} as a non-tensor value, this model has a tensor there; it "
                                  "was not saved from this model")  # fmt: skip
        if tuple(entry.size) != tuple(tensor.shape):
            raise CheckpointError(
                f"{where}: {key} has shape {_shape(entry.size)} in the checkpoint, {_shape(tensor.shape)} in this "
                "model; load it into the model it was saved from (the same model settings)"
            )
        if entry.properties.dtype != tensor.dtype:
            raise CheckpointError(
                f"{where}: {key} is {entry.properties.dtype} in the checkpoint, {tensor.dtype} in this model; load "
                "it with the dtype it was saved in (the same param_dtype)"
            )
    prefixes = tuple(f"{key}." for key in strict)
    extra = sorted(key for key in saved if key.startswith(prefixes) and key not in wanted)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{where}: holds {extra[0]}{more}, which this model does not have; load it into the "
                              "model it was saved from")  # fmt: skip


def check_state_names(directory: str | Path, metadata: Metadata, prefix: str, names: Sequence[str]) -> None:
    """Every key under ``prefix`` (``optim.state``) is ``<prefix>.<one of names>.<state key>``."""
    start = f"{prefix}."
    by_length = sorted(names, key=len, reverse=True)
    for key in sorted(metadata.state_dict_metadata):
        if not key.startswith(start):
            continue
        rest = key[len(start) :]
        if not any(rest.startswith(f"{name}.") for name in by_length):
            raise CheckpointError(
                f"checkpoint {directory}: {METADATA}: holds optimizer state {key} of a parameter this model does not "
                "have; load it into the model it was saved from"
            )


_SIZE_MISMATCH = re.compile(
    r"Size mismatch between saved torch\.Size\((\[.*?\])\) and current:? torch\.Size\((\[.*?\])\) for (\S+)"
)
_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (\S+?)\.?$")


def load_failure(directory: str | Path, error: CheckpointException) -> CheckpointError:
    """One line for what ``dcp.load`` raised: the first failing rank's own
    :class:`CheckpointError` as it is (it names the file), torch's size and missing-key
    messages in the words of :func:`check_fits`, anything else with its first line."""
    failures = error.failures
    if not failures:
        return CheckpointError(f"checkpoint {directory}: cannot load it ({str(error).splitlines()[0]})")
    first = failures[min(failures)][0]
    if isinstance(first, CheckpointError):
        return first
    text = (str(first).strip().splitlines() or [type(first).__name__])[0]
    where = f"checkpoint {directory}: {METADATA}"
    if match := _SIZE_MISMATCH.search(text):
        saved, here, key = match.groups()
        return CheckpointError(
            f"{where}: {key} has shape {_shape(_ints(saved))} in the checkpoint, {_shape(_ints(here))} in this "
            "model; load it into the model it was saved from (the same model settings)"
        )
    if match := _MISSING_KEY.search(text):
        return CheckpointError(f"{where}: has no {match.group(1)}; load it into the model it was saved from")
    return CheckpointError(f"checkpoint {directory}: cannot load it ({cause(first)})")


def _ints(text: str) -> list[int]:
    """``[64, 32]`` -> ``[64, 32]`` (the integers in torch's printed size)."""
    return [int(n) for n in re.findall(r"\d+", text)]
