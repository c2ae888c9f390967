"""The integrity record of a DCP checkpoint: every file's size and sha256, written last.

A ``torch.distributed.checkpoint`` directory holds ``.metadata`` and ``__<rank>_<i>.distcp``
files and nothing that says what their bytes should be. zero_lab adds the record the native
format keeps in its manifest (:mod:`zero_lab.checkpoint`): ``files.sha256.json`` ::

    {"format": "zero_lab.dcp-record/1", "files": {".metadata": {"bytes": 5789, "sha256": "..."}, ...}}

listing every regular file of the directory (the record itself aside). One process writes it
after every rank finished writing (:func:`write_record`, atomically: a temporary sibling
renamed into place), so a directory whose record exists was complete when the record was
made. A reader checks each file against it before using a byte of it (:func:`verify_file`):
missing, truncated, grown or changed (same size, another sha256) is one
:class:`~zero_lab.checkpoint.CheckpointError` line naming the checkpoint and the file. A
directory without a record (written by torch's ``dcp.save`` alone, or by another tool) is
read unverified: :func:`read_record` returns ``None`` and the caller says so.

    write_record(path)                       # one process, after dcp.save returned everywhere
    record = read_record(path)               # None: no record
    verify_file(path, "__0_0.distcp", record)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zero_lab.checkpoint import CheckpointError, check_digest, file_digest, read_json_file, regular_file_size
from zero_lab.files import write_json

__all__ = ["RECORD", "RECORD_FORMAT", "read_record", "verify_all", "verify_file", "write_record"]

RECORD = "files.sha256.json"
RECORD_FORMAT = "zero_lab.dcp-record/1"


def write_record(directory: str | Path) -> Path:
    """Record the size and sha256 of every regular file in ``directory`` (written last, atomically)."""
    directory = Path(directory)
    names = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != RECORD)
    files = {name: file_digest(directory / name) for name in names}
    return write_json(directory / RECORD, {"format": RECORD_FORMAT, "files": files}, indent=1)


def read_record(directory: str | Path) -> dict[str, dict[str, Any]] | None:
    """``{file name: {"bytes", "sha256"}}`` from ``directory``'s record; ``None`` when it has none.
    A record that is there but is not one (not JSON, another format) is a :class:`CheckpointError`."""
    path = Path(directory) / RECORD
    if not path.exists():
        return None
    record = read_json_file(path, "integrity record")
    files = record.get("files") if isinstance(record, dict) else None
    entries_ok = isinstance(files, dict) and all(isinstance(v, dict) for v in files.values())
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT or not entries_ok:
        raise CheckpointError(
            f"checkpoint {path.parent}: {RECORD} is not a {RECORD_FORMAT} record; restore it from a good copy, "
            f"or delete it to load the checkpoint unverified"
        )
    return files


def verify_file(directory: str | Path, name: str, record: dict[str, dict[str, Any]]) -> None:
    """Raise a :class:`CheckpointError` naming ``name`` unless it is in ``record`` with its size and sha256."""
    directory = Path(directory)
    if name not in record:
        raise CheckpointError(
            f"checkpoint {directory}: {name} is not in its record ({RECORD}); the checkpoint was changed after it "
            "was written"
        )
    path, expected = directory / name, record[name]
    if not path.exists():
        raise CheckpointError(f"checkpoint {directory}: {name} is missing (its record lists {expected.get('bytes')} "
                              "bytes); restore the file from a good copy")  # fmt: skip
    size = regular_file_size(path)
    if isinstance(expected.get("bytes"), int) and size < expected["bytes"]:
        raise CheckpointError(f"checkpoint {directory}: {name} is truncated: it has {size} bytes, its record "
                              f"({RECORD}) says {expected['bytes']}; restore the file from a good copy")  # fmt: skip
    check_digest(path, expected, f"checkpoint {directory}", f"its record ({RECORD})")


def verify_all(directory: str | Path, record: dict[str, dict[str, Any]]) -> None:
    """:func:`verify_file` for every file the record lists."""
    for name in sorted(record):
        verify_file(directory, name, record)
