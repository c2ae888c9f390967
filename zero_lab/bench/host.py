"""What the machine has: RSS and its peak, free memory, and giving freed memory back (Linux, glibc).

Timing phases keep freed memory in the heap (:func:`keep_freed_memory`: no page faults from one
step's temporaries to the next). The memory phase reads a strategy's *peak RSS Δ*: reset the kernel's peak mark
(``/proc/self/clear_refs``), build and run the strategy, read ``VmHWM``. Ranks set
malloc's mmap threshold low (:func:`return_freed_memory_to_os`) so freed tensors leave
the process and the next strategy starts from the same baseline. Before every build,
:func:`memory_allows` (one all-reduce) makes all ranks agree that the machine still has
room, so the benchmark never pushes a shared machine out of memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

import torch
import torch.distributed as dist

__all__ = [
    "FLOOR_BYTES",
    "MMAP_THRESHOLD_MAX",
    "available_bytes",
    "keep_freed_memory",
    "memory_allows",
    "peak_rss_bytes",
    "release_memory",
    "reset_peak_rss",
    "return_freed_memory_to_os",
    "rss_bytes",
]

#: Memory every rank leaves free for the rest of the machine when deciding to build more.
FLOOR_BYTES = 2 * 2**30


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rss_bytes() -> int:
    return _proc_status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    return _proc_status_kib("VmHWM") * 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS; False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def available_bytes() -> int:
    """The machine's ``MemAvailable`` (8 GiB assumed where /proc/meminfo does not say)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 2**30


def release_memory() -> None:
    """Collect garbage and hand malloc's free heap back to the OS (glibc ``malloc_trim``)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def return_freed_memory_to_os(threshold: int = 64 * 1024) -> bool:
    """glibc: serve every allocation ≥ ``threshold`` by mmap, so ``free`` unmaps it at once.

    Without this, malloc's dynamic threshold keeps freed tensors of up to 32 MiB in its
    heap, and a strategy built after another one reuses them without raising RSS.
    """
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, threshold))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


#: glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``).
MMAP_THRESHOLD_MAX = 32 * 2**20


def keep_freed_memory(trim_threshold: int = 2**30) -> bool:
    """glibc: keep freed memory for the next allocation (the timing phases' allocator, and the
    calibration's).

    By default glibc gives freed memory back to the OS (``munmap`` of a chunk above its dynamic
    mmap threshold, a trim of the heap's top above twice that), so a step that frees its
    temporaries and makes them again faults their pages back in, more or less each step
    depending on what came before. On this host (a Firecracker VM) one Adam step of
    12 × Linear(768) took 11-35 ms from one process to the next that way, and 10.5-11.1 ms with
    this setting: allocations below :data:`MMAP_THRESHOLD_MAX` come from the heap, which keeps
    up to ``trim_threshold`` free bytes at its top. (Setting only the trim threshold turns off
    glibc's dynamic mmap threshold and makes every step fault: 35 ms.)"""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mapped = libc.mallopt(-3, MMAP_THRESHOLD_MAX)  # M_MMAP_THRESHOLD
        return bool(mapped) and bool(libc.mallopt(-1, trim_threshold))  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


def memory_allows(need_bytes: int) -> bool:
    """Collective: True on every rank iff every rank has ``need_bytes`` + a floor available.

    ``MemAvailable`` is machine-wide; all ranks of a world share it, so the need is
    multiplied by the world size. One all-reduce (MIN) keeps the decision identical on
    all ranks, so no rank builds a model (and its collectives) the others skip.
    """
    world = dist.get_world_size()
    free = torch.tensor([available_bytes() - world * need_bytes - FLOOR_BYTES], dtype=torch.float64)
    dist.all_reduce(free, op=dist.ReduceOp.MIN)
    return free.item() >= 0
