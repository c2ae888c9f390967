"""Hierarchical sharding: shard inside groups of S ranks, replicate across the W/S groups.

With ``shard_size=S`` (HSDP's, MiCS's and ZeRO++ hpZ's layout) the W ranks of a data-parallel
group are cut into W/S *shard groups* of S consecutive ranks (``[0..S-1], [S..2S-1], ...``: a
node's ranks when S is the ranks per node) and S *replica groups*, the ranks with the same
index in their shard group (``[i, i+S, i+2S, ...]``). The optimizer state is partitioned over
a shard group and replicated across the replica group: each rank steps the elements its index
owns, parameters are exchanged inside the shard group only, and a gradient reduction that
scatters reaches the owner inside the shard group first, then the owner's segment is
all-reduced across its replica group (only Ψ/S of each rank's gradient crosses groups).

:func:`shard_ranks` and :func:`replica_ranks` are pure (any W, no process group);
:func:`hierarchy_of` creates the process groups, on every rank of the world in the same order
(``new_subgroups_by_enumeration``: every shard group, then every replica group), as
``torch.distributed.new_group`` requires. Usage::

    hier = hierarchy_of(dist.group.WORLD, shard_size=2)   # at W=4: shard groups [0,1] [2,3]
    hier.shard_group, hier.replica_group                   # this rank's two groups
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from zero_lab.comm import group_timeout, ranks_per_node

__all__ = [
    "NODE",
    "Hierarchy",
    "check_shard_size",
    "hierarchy_of",
    "replica_ranks",
    "resolve_shard_size",
    "shard_ranks",
]

#: ``shard_size="node"``: the ranks of one node, as the launcher says (:func:`zero_lab.comm.ranks_per_node`).
NODE = "node"


def check_shard_size(shard_size: int | None, world_size: int, name: str = "shard_size") -> int:
    """``shard_size`` (``None``: the whole world) as an int dividing ``world_size``; else a
    ``ValueError`` naming ``name`` and the sizes that would do."""
    if shard_size is None:
        return world_size
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"{name}={shard_size!r}: must be a positive number of ranks (or None: all {world_size})")
    if world_size % shard_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"{name}={shard_size} does not divide the world size {world_size}: the state is sharded over groups of "
            f"{name} ranks and replicated across world_size/{name} of them; use one of {divisors}"
        )
    return shard_size


def resolve_shard_size(
    shard_size: int | str | None,
    world_size: int,
    name: str = "shard_size",
    environ: Mapping[str, str] | None = None,
) -> int:
    """:func:`check_shard_size`, with ``"node"`` read as the ranks of one node (the launcher's
    ``LOCAL_WORLD_SIZE`` or Slurm's tasks per node, at most ``world_size``); a ``ValueError`` naming
    ``name`` when the launcher does not say."""
    if shard_size == NODE:
        per_node = ranks_per_node(environ)
        if per_node is None:
            raise ValueError(
                f"{name}=node: the launcher does not say how many ranks share a node (LOCAL_WORLD_SIZE from "
                "torchrun, SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE from srun); give a number of ranks"
            )
        shard_size = min(per_node, world_size)
    return check_shard_size(shard_size, world_size, name)  # type: ignore[arg-type]


def shard_ranks(world_size: int, shard_size: int) -> list[list[int]]:
    """The shard groups: S consecutive positions each, ``[[0..S-1], [S..2S-1], ...]``."""
    check_shard_size(shard_size, world_size)
    return [list(range(g * shard_size, (g + 1) * shard_size)) for g in range(world_size // shard_size)]


def replica_ranks(world_size: int, shard_size: int) -> list[list[int]]:
    """The replica groups: the positions with the same index in their shard group, ``[[i, i+S, ...]]``."""
    check_shard_size(shard_size, world_size)
    return [list(range(i, world_size, shard_size)) for i in range(shard_size)]


@dataclass(frozen=True)
class Hierarchy:
    """This rank's place in a hierarchy: its shard group (S ranks, where the state is
    partitioned) and its replica group (W/S ranks holding the same shards); ``group_index``
    is which shard group it is in (0 writes the checkpoints)."""

    world_size: int
    shard_size: int
    group_index: int
    shard_group: Any
    replica_group: Any

    @property
    def replicas(self) -> int:
        return self.world_size // self.shard_size

    @property
    def hierarchical(self) -> bool:
        """Whether there is more than one shard group."""
        return self.shard_size < self.world_size


def _live(group: Any) -> bool:
    try:
        dist.get_process_group_ranks(group)
    except (ValueError, RuntimeError, KeyError):
        return False
    return True


def _global(ranks: tuple[int, ...], positions: list[list[int]]) -> list[list[int]]:
    return [[ranks[i] for i in group] for group in positions]


_CREATED: dict[tuple[tuple[int, ...], int, str], Hierarchy] = {}


def hierarchy_of(process_group: Any, shard_size: int | str | None, *, tag: str = "") -> Hierarchy:
    """This rank's :class:`Hierarchy` over ``process_group``'s ranks (in group-rank order).

    ``shard_size``: a number of ranks, or ``"node"`` (:func:`resolve_shard_size`). ``None`` or the
    group's size: one shard group, ``process_group`` itself, and
    a replica group of this rank alone (nothing created). Otherwise the groups are created once
    per (ranks, S, ``tag``) and reused; every rank of the *world* must call this in the same
    order (``new_group``'s rule). ``tag`` asks for groups of their own (the gradient reduction
    keeps its messages apart from the optimizer's).
    """
    group = process_group if process_group is not None else dist.group.WORLD
    ranks = tuple(dist.get_process_group_ranks(group))
    world = len(ranks)
    size = resolve_shard_size(shard_size, world)
    position = ranks.index(dist.get_rank())
    if size == world:
        return Hierarchy(world, size, 0, group, None)
    key = (ranks, size, tag)
    known = _CREATED.get(key)
    if known is not None and _live(known.shard_group) and _live(known.replica_group):
        return known
    made_with = {"timeout": group_timeout(), "backend": dist.get_backend(group)}
    shard, _ = dist.new_subgroups_by_enumeration(_global(ranks, shard_ranks(world, size)), **made_with)
    replica, _ = dist.new_subgroups_by_enumeration(_global(ranks, replica_ranks(world, size)), **made_with)
    made = Hierarchy(world, size, position // size, shard, replica)
    _CREATED[key] = made
    return made
