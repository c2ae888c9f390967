"""What this host offers the ranks a job starts here: CPU cores and memory available."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_memory_bytes", "cpu_cores"]


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (what can be allocated without swapping), or ``None``."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
