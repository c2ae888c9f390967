"""Shared by the client scripts: a digest of a model's parameters and rank 0's result file."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zero_lab import background

torch.set_num_threads(1)


def out_dir() -> Path:
    """The directory the test passed (argv[1]): where runs write and rank 0 leaves result.json."""
    return Path(sys.argv[1])


def digest(module: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in order: equal digests are bitwise equal parameters."""
    sha = hashlib.sha256()
    for param in module.parameters():
        sha.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def write_result(result: dict[str, Any]) -> None:
    """Rank 0 writes ``result`` to ``<out_dir>/result.json``; every rank agrees on the digests first."""
    digests = {k: v for k, v in result.items() if isinstance(v, str) and len(v) == 64}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digests)
    result["ranks_agree"] = all(d == digests for d in everyone)
    if dist.get_rank() == 0:
        (out_dir() / "result.json").write_text(json.dumps(result))


def finish() -> None:
    """Wait for every rank, destroy the process group, end zero_lab's threads, flush and leave with
    ``os._exit(0)``: what the scripts assert is written by then, and their exit must not depend on
    torch's own teardown at finalization (a daemon thread freeing a Gloo object then aborts the
    process: "terminate called without an active exception"; zero_lab's threads are ended before
    it, tests/dist/test_exit.py, but a client's or torch's are not ours to end)."""
    dist.barrier()
    dist.destroy_process_group()
    background.end_all()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
