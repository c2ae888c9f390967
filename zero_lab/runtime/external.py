"""Ranks started by an external launcher — ``torchrun`` or Slurm's ``srun`` — one run dir for all.

Under torchrun or ``srun -n N`` (N > 1) every process is one rank and executes ``@hydra.main``
itself. Left alone, each would resolve ``${now:...}`` on its own clock (a skew of one second
gives two run dirs) and all would write ``.hydra/`` and the job log. So before Hydra creates
the run dir (a Hydra callback: :func:`zero_lab.app.check.before_start.share_run_dir`), :func:`shared_run_dir`:

1. joins the process group the launcher describes (:func:`join`: torchrun's ``env://``
   variables, or, under srun, the ones :mod:`zero_lab.runtime.slurm` derives from
   ``SLURM_*``: rendezvous at the first node of the step's node list);
2. lets global rank 0 pick the run dir and broadcasts it (one tensor, via
   :class:`zero_lab.comm.Communicator`), so every node uses the same path;
3. returns that dir, which every rank's job uses; ranks > 0 write no ``.hydra/`` and no job
   log (what :data:`FOLLOWER_OVERRIDES` say), so only rank 0 writes shared files.

    torchrun --nproc_per_node 2 train.py optim=zero_adam
    srun -N2 --ntasks-per-node=2 python train.py optim=zero_adam
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator
from zero_lab.runtime.slurm import slurm_world

__all__ = ["FOLLOWER_OVERRIDES", "ExternalWorld", "active", "detect", "join", "rank", "shared_run_dir"]

_PATH_BYTES = 4096
#: What a rank > 0 adds to its Hydra overrides: no ``.hydra/``, no job log (rank 0 writes those).
FOLLOWER_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled")


@dataclass(frozen=True)
class ExternalWorld:
    """This process's rank in a world an external launcher started (``launcher``: torchrun or srun)."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    env: dict[str, str]  # what torch's env:// rendezvous reads (RANK, WORLD_SIZE, MASTER_ADDR, ...)


def detect(environ: Mapping[str, str] | None = None, port: int | None = None) -> ExternalWorld | None:
    """The world torchrun (first) or srun (several tasks) started this process in, or ``None``.

    ``port`` overrides the rendezvous port srun's world derives from the job id (``dist.master_port``).
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        return ExternalWorld("torchrun", rank, world, int(env.get("LOCAL_RANK", "0")), {})
    slurm = slurm_world(env, port)
    if slurm is None:
        return None
    variables = {
        "RANK": str(slurm.rank),
        "WORLD_SIZE": str(slurm.world_size),
        "LOCAL_RANK": str(slurm.local_rank),
        "MASTER_ADDR": slurm.master_addr,
        "MASTER_PORT": str(slurm.master_port),
    }
    return ExternalWorld("srun", slurm.rank, slurm.world_size, slurm.local_rank, variables)


def active(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process is one rank of a world torchrun or srun started."""
    return detect(environ) is not None


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank under an external launcher; 0 otherwise."""
    world = detect(environ)
    return world.rank if world is not None else 0


def join(backend: str, timeout_s: float, port: int | None = None) -> ExternalWorld:
    """Join the world the launcher set up (idempotent); returns it. Under srun, the ``env://``
    variables are set from ``SLURM_*`` first, so code that reads ``RANK``/``LOCAL_RANK`` sees them."""
    world = detect(port=port)
    if world is None:
        raise RuntimeError("not started by torchrun or by srun with several tasks: no world to join")
    os.environ.update(world.env)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    if dist.get_world_size() != world.world_size:  # never train half a world
        raise RuntimeError(f"{world.launcher}: {world.world_size} ranks, the process group: {dist.get_world_size()}")
    return world


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


def shared_run_dir(run_dir: str, backend: str, timeout_s: float, device: torch.device, port: int | None = None) -> str:
    """Join the world and return rank 0's ``run_dir`` (on every rank)."""
    join(backend, timeout_s, port)
    return agree_on_path(run_dir, device)
