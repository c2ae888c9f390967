"""Ranks started by an external runner — ``torchrun`` or Slurm's ``srun`` — one run dir for all.

Under torchrun or ``srun -n N`` (N > 1) every process is one rank and executes ``@hydra.main``
itself. Left alone, each would resolve ``${now:...}`` on its own clock (a skew of one second
gives two run dirs) and all would write ``.hydra/`` and the job log. So before Hydra creates
the run dir (a Hydra callback: :func:`zero_lab.app.check.before_start.share_run_dir`), :func:`shared_run_dir`:

1. joins the process group the runner describes (:func:`join`: torchrun's ``env://``
   variables, or, under srun, the ones :mod:`zero_lab.runtime.slurm` derives from
   ``SLURM_*``: rendezvous at the first node of the step's node list);
2. lets global rank 0 pick the run dir and broadcasts it (one tensor, via
   :class:`zero_lab.comm.Communicator`), so every node uses the same path;
3. returns that dir, which every rank's job uses; ranks > 0 write no ``.hydra/`` and no job
   log (what :data:`FOLLOWER_OVERRIDES` say), so only rank 0 writes shared files.

    torchrun --nproc_per_node 2 train.py optim=zero_adam
    srun -N2 --ntasks-per-node=2 python train.py optim=zero_adam

Which runner started this process is one question with one answer per process: each runner
is an :class:`ExternalRunner` (``torchrun``: :class:`Torchrun`, ``srun``: :class:`Srun`) in one
registry, and :func:`detect` asks them in turn, once (its answer is kept for the process: the
variables a runner sets do not change under a running rank). A new runner is one class with
``name``, ``detect(environ, port)`` and ``world_size_fix(wanted)``, registered with
:func:`register_runner` (docs/core.md, "Extending zero_lab", runs one)::

    world = detect()   # ExternalWorld(runner="torchrun", rank=1, world_size=2, ...) or None
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator, set_group_timeout
from zero_lab.runtime.slurm import slurm_world

__all__ = [
    "FOLLOWER_OVERRIDES",
    "ExternalRunner",
    "ExternalWorld",
    "Srun",
    "Torchrun",
    "active",
    "detect",
    "join",
    "rank",
    "register_runner",
    "registered_runners",
    "runner_named",
    "shared_run_dir",
]

_PATH_BYTES = 4096
#: What a rank > 0 adds to its Hydra overrides: no ``.hydra/``, no job log (rank 0 writes those).
FOLLOWER_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled")
L = TypeVar("L", bound=type)


@dataclass(frozen=True)
class ExternalWorld:
    """This process's rank in a world an external runner started (``runner``: its registered name)."""

    runner: str
    rank: int
    world_size: int
    local_rank: int
    env: dict[str, str]  # what torch's env:// rendezvous reads (RANK, WORLD_SIZE, MASTER_ADDR, ...) if not set
    run_id: str = field(default="run")  # the runner's id of this job: names the run dir Hydra cannot


@runtime_checkable
class ExternalRunner(Protocol):
    """A runner that starts every rank as a process of its own and tells each its place in
    the environment: ``detect`` reads it (pure: the mapping and the configured
    ``dist.master_port`` in, an :class:`ExternalWorld` or ``None`` out); ``world_size_fix`` is
    what to do when the command line asks for ``dist.world_size=wanted`` ranks but the
    runner started another number."""

    name: str

    def detect(self, environ: Mapping[str, str], port: int | None) -> ExternalWorld | None: ...

    def world_size_fix(self, wanted: int) -> str: ...


class Torchrun:
    """``torchrun``: it sets torch's ``env://`` variables itself (``TORCHELASTIC_RUN_ID`` marks it)."""

    name = "torchrun"

    def detect(self, environ: Mapping[str, str], port: int | None) -> ExternalWorld | None:
        if "TORCHELASTIC_RUN_ID" not in environ or "RANK" not in environ or "WORLD_SIZE" not in environ:
            return None
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local = int(environ.get("LOCAL_RANK", "0"))
        return ExternalWorld(self.name, rank, world, local, {}, run_id=environ["TORCHELASTIC_RUN_ID"])

    def world_size_fix(self, wanted: int) -> str:
        return "drop dist.world_size or change --nproc_per_node/--nnodes"


class Srun:
    """Slurm's ``srun`` with several tasks: the ``env://`` variables derived from ``SLURM_*``
    (:func:`zero_lab.runtime.slurm.slurm_world`; ``port`` overrides the one derived from the job id)."""

    name = "srun"

    def detect(self, environ: Mapping[str, str], port: int | None) -> ExternalWorld | None:
        slurm = slurm_world(environ, port)
        if slurm is None:
            return None
        variables = {
            "RANK": str(slurm.rank),
            "WORLD_SIZE": str(slurm.world_size),
            "LOCAL_RANK": str(slurm.local_rank),
            "MASTER_ADDR": slurm.master_addr,
            "MASTER_PORT": str(slurm.master_port),
        }
        return ExternalWorld(self.name, slurm.rank, slurm.world_size, slurm.local_rank, variables, slurm.job_id)

    def world_size_fix(self, wanted: int) -> str:
        return (
            "under srun every task is one rank: drop dist.world_size, or start one task (srun -n1) "
            f"to spawn {wanted} ranks inside it"
        )


#: The runners :func:`detect` asks, in order: torchrun first (it may run inside an srun task).
_RUNNERS: dict[str, ExternalRunner] = {c.name: c() for c in (Torchrun, Srun)}
#: :func:`detect`'s answer for this process (``port``, ``world``; cleared when a runner is registered).
_DETECTED: dict[str, Any] = {}


def register_runner(cls: L) -> L:
    """Make ``cls()`` a runner :func:`detect` asks, before those registered earlier (a runner
    is started inside an outer one, as torchrun inside an srun task, and the innermost is the
    world); returns ``cls``, so it works as a decorator. Registering the same class again is a no-op."""
    runner = cls()
    if not isinstance(runner, ExternalRunner):
        raise TypeError(f"{cls.__name__} is not an ExternalRunner: it needs name, detect() and world_size_fix()")
    known = _RUNNERS.get(runner.name)
    if known is not None:
        if type(known) is cls:
            return cls
        raise ValueError(f"runner {runner.name!r} is already {type(known).__name__}; give {cls.__name__} another name")
    reordered = {runner.name: runner, **{k: v for k, v in _RUNNERS.items() if k != runner.name}}
    _RUNNERS.clear()
    _RUNNERS.update(reordered)
    _DETECTED.clear()
    return cls


def registered_runners() -> tuple[str, ...]:
    """Every registered runner's name, in the order :func:`detect` asks them."""
    return tuple(_RUNNERS)


def runner_named(name: str) -> ExternalRunner:
    """The runner registered as ``name`` (an :class:`ExternalWorld`'s ``runner``)."""
    try:
        return _RUNNERS[name]
    except KeyError:
        raise ValueError(f"no runner {name!r}; registered: {list(_RUNNERS)}") from None


def detect(environ: Mapping[str, str] | None = None, port: int | None = None) -> ExternalWorld | None:
    """The world a registered runner started this process in (the first that recognises its
    environment), or ``None``. Without ``environ`` it reads ``os.environ`` once per process: every
    later call gets the same answer (one that names another ``port`` reads it again).

    ``port`` overrides the rendezvous port a runner derives (srun: from the job id; ``dist.master_port``).
    """
    if environ is None and _DETECTED and port in (None, _DETECTED["port"]):
        return _DETECTED["world"]  # a port only moves srun's rendezvous: rank() and active() take any
    env = os.environ if environ is None else environ
    world = next((w for w in (runner.detect(env, port) for runner in _RUNNERS.values()) if w), None)
    if environ is None:
        _DETECTED.update(port=port, world=world)
    return world


def active(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process is one rank of a world an external runner started."""
    return detect(environ) is not None


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank under an external runner; 0 otherwise."""
    world = detect(environ)
    return world.rank if world is not None else 0


def join(backend: str, timeout_s: float, port: int | None = None) -> ExternalWorld:
    """Join the world the runner set up (idempotent); returns it. Under srun, the ``env://``
    variables are set from ``SLURM_*`` first, so code that reads ``RANK``/``LOCAL_RANK`` sees them."""
    world = detect(port=port)
    if world is None:
        raise RuntimeError("not started by torchrun or by srun with several tasks: no world to join")
    os.environ.update(world.env)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    set_group_timeout(timedelta(seconds=timeout_s))
    if dist.get_world_size() != world.world_size:  # never train half a world
        raise RuntimeError(f"{world.runner}: {world.world_size} ranks, the process group: {dist.get_world_size()}")
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
