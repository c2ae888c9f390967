"""Atomic files: the one place that writes a file so a reader never sees half of it.

A file is written to a temporary sibling unique to this process and call
(``.<name>.tmp-<pid>-<random>``, so two writers never share one), flushed and fsynced,
then ``os.replace``\\ d over the target and the directory fsynced: a crash, SIGKILL or
full disk leaves either the old file or the new one, never a mix. JSON is written
strictly: NaN and ±Inf (which JSON has no spelling for) become ``null`` instead of
Python's bare ``NaN``, so every reader can parse what zero_lab writes.

    write_atomic(path, lambda f: torch.save(state, f))
    write_json(run_dir / "summary.json", {"final_loss": float("nan")})   # -> null
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["finite_json", "fsync_dir", "write_atomic", "write_json"]


def fsync_dir(path: str | Path) -> None:
    """Make a rename or create inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """``write(file)`` into a temporary sibling, fsync, rename over ``path``, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (at any depth) replaced by ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as strict JSON (non-finite floats as ``null``), atomically."""
    text = json.dumps(finite_json(obj), indent=indent, allow_nan=False, default=str) + "\n"
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")))
