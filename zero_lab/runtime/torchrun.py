"""Running ``train.py`` under ``torchrun`` (one node or several): one run dir for all ranks.

Under torchrun every rank executes ``@hydra.main`` itself. Left alone, each would resolve
``${now:...}`` on its own clock (a skew of one second gives two run dirs) and all would
write ``.hydra/`` and the job log. So before Hydra starts, :func:`torchrun_overrides`:

1. joins the process group torchrun describes (``env://``);
2. lets global rank 0 pick the run dir and broadcasts it (one tensor, via
   :class:`zero_lab.comm.Communicator`), so every node uses the same path;
3. returns the overrides every rank adds: ``hydra.run.dir=<that dir>`` and
   ``dist.world_size=<WORLD_SIZE>``; ranks > 0 also get ``hydra.output_subdir=null`` and
   Hydra's logging disabled, so only rank 0 writes shared files.

    torchrun --nproc_per_node 2 train.py optim=zero_adam
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator

__all__ = ["active", "torchrun_overrides"]

_PATH_BYTES = 4096


def active(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process was started by torchrun (or another torch elastic agent)."""
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


def init_process_group(backend: str, timeout_s: float) -> None:
    """Join the world torchrun set up (idempotent)."""
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def agree_on_path(path: str, device: torch.device) -> str:
    """Rank 0's ``path`` on every rank (one broadcast of a fixed-size byte tensor)."""
    encoded = path.encode()
    if len(encoded) >= _PATH_BYTES:
        raise ValueError(f"run dir path longer than {_PATH_BYTES} bytes: {path[:80]}...")
    buffer = torch.zeros(_PATH_BYTES, dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        buffer[: len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
    Communicator().broadcast_many([(buffer, 0)], op="run_dir")
    raw = bytes(buffer.cpu().tolist())
    return raw.split(b"\0", 1)[0].decode()


def torchrun_overrides(run_dir: str, backend: str, timeout_s: float, device: torch.device) -> list[str]:
    """Join the world, agree on ``run_dir`` (rank 0's) and return the Hydra overrides to add."""
    init_process_group(backend, timeout_s)
    agreed = agree_on_path(run_dir, device)
    overrides = [f"hydra.run.dir={_quote(agreed)}", f"dist.world_size={dist.get_world_size()}"]
    if dist.get_rank() > 0:
        overrides += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return overrides


def _quote(value: str) -> str:
    """Quote a path for Hydra's override grammar."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
