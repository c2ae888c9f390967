"""What Slurm tells a task about its world, read from the environment ``srun`` sets.

Under ``srun -N2 -n4 python train.py`` every task is one rank: ``SLURM_PROCID`` is its
global rank, ``SLURM_STEP_NUM_TASKS`` the world size (a batch script's own shell, which has
``SLURM_NTASKS`` but no step, is not a rank),
``SLURM_LOCALID`` its rank on its node; the rendezvous host is the first node of the step's
node list (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``), which Slurm writes in its
hostlist syntax (:func:`expand_hostlist`: ``n[1-2],gpu[08-10]`` -> ``n1 n2 gpu08 gpu09
gpu10``); the port is derived from the job and step ids (:func:`default_port`), so two jobs
sharing a node do not collide, unless the config names one (``dist.master_port``).

A step of one task is not a world: the job then starts its own ranks inside the task
(``hydra/launcher=slurm`` in its one-task-per-job mode).

    world = slurm_world(os.environ, port=None)   # None outside srun or with one task
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PORT_BASE", "PORT_SPAN", "SlurmWorld", "default_port", "expand_hostlist", "requeue_count", "slurm_world"]

#: Ports derived from job ids fall in ``[PORT_BASE, PORT_BASE + PORT_SPAN)``, below Linux's ephemeral range.
PORT_BASE = 15000
PORT_SPAN = 15000
#: Set for the tasks of a job step (``srun``), not for a batch script's own shell.
_REQUIRED = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS")


@dataclass(frozen=True)
class SlurmWorld:
    """One task's place in the world Slurm started: its ranks and where to rendezvous."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    job_id: str


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list as names, in order: ``"n[1-3,7],login"`` -> ``[n1, n2, n3, n7, login]``.

    Ranges keep their zero padding (``gpu[08-10]`` -> ``gpu08 gpu09 gpu10``); several bracket
    groups in one name multiply (``r[1-2]n[1-2]`` -> ``r1n1 r1n2 r2n1 r2n2``).
    """
    names: list[str] = []
    for item in _split_top_level(hostlist):
        names.extend(_expand_one(item))
    return names


def _split_top_level(hostlist: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    items, depth, current = [], 0, ""
    for char in hostlist.strip():
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in Slurm host list {hostlist!r}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"unbalanced '[' in Slurm host list {hostlist!r}")
    items.append(current)
    return [item for item in items if item]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    out = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in Slurm host name {name!r}")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            out.extend(f"{head}{number:0{width}d}{rest}" for rest in _expand_one(tail))
    return out


def default_port(job_id: str, step_id: str | None) -> int:
    """The rendezvous port of a job step: a pure function of the job and step ids, so every
    task of the step computes the same one without talking to the others."""
    digits = re.sub(r"\D", "", job_id) or "0"
    step = int(step_id) if step_id and step_id.isdigit() else 0
    return PORT_BASE + (int(digits) * 31 + step) % PORT_SPAN


def slurm_world(environ: Mapping[str, str], port: int | None = None) -> SlurmWorld | None:
    """This task's :class:`SlurmWorld`, or ``None`` outside ``srun`` or in a step of one task."""
    if any(key not in environ for key in _REQUIRED):
        return None
    tasks = int(environ["SLURM_STEP_NUM_TASKS"])
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if not nodelist or tasks < 2:
        return None
    job_id = environ["SLURM_JOB_ID"]
    return SlurmWorld(
        rank=int(environ["SLURM_PROCID"]),
        world_size=tasks,
        local_rank=int(environ["SLURM_LOCALID"]),
        master_addr=expand_hostlist(nodelist)[0],
        master_port=port or default_port(job_id, environ["SLURM_STEP_ID"]),
        job_id=job_id,
    )


def requeue_count(environ: Mapping[str, str]) -> int:
    """How many times Slurm has requeued this job (``SLURM_RESTART_COUNT``; 0 on the first start)."""
    value = environ.get("SLURM_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0
