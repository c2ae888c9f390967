"""Checks the optimizer's API makes at the call, each a one-line ``ValueError`` that names
what differs and what to do.

* :func:`check_target_rank` — ``consolidate_state_dict(to)`` needs ``0 <= to < world_size``
  (an unchecked ``to`` made a rank wait for a peer that does not exist, or crash).
* :func:`check_same_params_on_every_rank` — at construction, with one all-gather of two
  integers per rank (a count and a digest of every parameter's shape and dtype), every
  rank learns whether all ranks passed the same parameters; only when they did not, a
  second all-gather of the shapes lets every rank name the first difference. Every rank
  takes the same branch (they all see the same digests), so a mismatch raises on every
  rank instead of deadlocking or aborting in the first step.
* :func:`check_state_matches_params` — ``load_state_dict`` of a state whose per-element
  tensors have another shape than this optimizer's parameters (another model's state)
  is refused, naming the first parameter that differs, instead of failing at the next step.

    check_target_rank(to, self.world_size)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from zero_lab.comm import Communicator

__all__ = ["check_same_params_on_every_rank", "check_state_matches_params", "check_target_rank"]

#: dtypes by code, for the shape table of the mismatch path (unknown dtypes are code -1).
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_MAX_DIMS = 8  # dims listed in a mismatch message; the digest covers all of them


def check_target_rank(to: Any, world_size: int) -> None:
    """``consolidate_state_dict(to=...)``: ``to`` must be a rank of the optimizer's group."""
    if isinstance(to, bool) or not isinstance(to, int) or not 0 <= to < world_size:
        raise ValueError(
            f"consolidate_state_dict(to={to!r}): to must be a rank of the process group, "
            f"an int with 0 <= to < {world_size} (its world size)"
        )


def _signature(params: Sequence[torch.Tensor]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(p.shape), str(p.dtype).removeprefix("torch.")) for p in params]


def _digest(signature: list[tuple[tuple[int, ...], str]]) -> int:
    """A 62-bit digest of the shapes and dtypes (fits a non-negative int64)."""
    return int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=8).digest(), "little") >> 2


def check_same_params_on_every_rank(comm: Communicator, params: Sequence[torch.Tensor]) -> None:
    """Raise ``ValueError`` on every rank unless every rank of ``comm`` passed parameters of
    the same number, shapes and dtypes, in the same order (collective: call on all ranks)."""
    if comm.world_size == 1:
        return
    device = params[0].device
    signature = _signature(params)
    mine = torch.tensor([len(signature), _digest(signature)], dtype=torch.int64, device=device)
    everyone = torch.zeros(2 * comm.world_size, dtype=torch.int64, device=device)
    comm.all_gather_into(everyone, mine, op="param_check")
    rows = everyone.view(comm.world_size, 2).cpu().tolist()
    if all(row == rows[0] for row in rows):
        return
    longest = max(count for count, _ in rows)
    tables = torch.zeros(comm.world_size * longest * (3 + _MAX_DIMS), dtype=torch.int64, device=device)
    comm.all_gather_into(tables, _table(params, longest).to(device).view(-1), op="param_check")
    per_rank = [_read_table(t, count) for t, (count, _) in zip(tables.view(comm.world_size, -1).cpu(), rows)]
    raise ValueError(_first_difference(per_rank, comm.rank))


def _table(params: Sequence[torch.Tensor], rows: int) -> torch.Tensor:
    """One row per parameter: ``[dtype code, ndim, numel, dims...]`` (zeros past the end)."""
    table = torch.zeros(rows, 3 + _MAX_DIMS, dtype=torch.int64)
    for i, p in enumerate(params):
        code = _DTYPES.index(p.dtype) if p.dtype in _DTYPES else -1
        table[i, :3] = torch.tensor([code, p.dim(), p.numel()])
        dims = list(p.shape)[:_MAX_DIMS]
        table[i, 3 : 3 + len(dims)] = torch.tensor(dims, dtype=torch.int64)
    return table


def _read_table(table: torch.Tensor, count: int) -> list[str]:
    """Each parameter as ``"(64, 32) float32"``."""
    out = []
    for code, ndim, numel, *dims in table.view(-1, 3 + _MAX_DIMS)[:count].tolist():
        shape = ", ".join(str(d) for d in dims[: min(ndim, _MAX_DIMS)])
        shape = f"({shape}{',' if ndim == 1 else ''}{', …' if ndim > _MAX_DIMS else ''})"
        dtype = str(_DTYPES[code]).removeprefix("torch.") if code >= 0 else "another dtype"
        out.append(f"{shape} {dtype}" if ndim <= _MAX_DIMS else f"{shape} {dtype} ({numel} elements)")
    return out


def _first_difference(per_rank: list[list[str]], rank: int) -> str:
    """The first parameter (by index) that differs between ranks, or the count."""
    fix = "every rank must pass the same parameters, in the same order"
    shortest = min(len(p) for p in per_rank)
    for index in range(shortest):
        seen = [p[index] for p in per_rank]
        if any(s != seen[0] for s in seen):
            other = next(r for r, s in enumerate(seen) if s != seen[0])
            return (
                f"ZeroRedundancyOptimizer on rank {rank}: parameter #{index} is {seen[0]} on rank 0 but "
                f"{seen[other]} on rank {other}; {fix}"
            )
    counts = ", ".join(f"rank {r}: {len(p)}" for r, p in enumerate(per_rank))
    if len({len(p) for p in per_rank}) > 1:
        return (
            f"ZeroRedundancyOptimizer on rank {rank}: the ranks passed different numbers of parameters "
            f"({counts}); {fix}"
        )
    return (
        f"ZeroRedundancyOptimizer on rank {rank}: the ranks' parameters differ in shape beyond dim {_MAX_DIMS}; {fix}"
    )


def check_state_matches_params(
    state_dict: dict[str, Any],
    params: Sequence[torch.Tensor],
    names: Sequence[str | None],
    elementwise: Sequence[bool],
) -> None:
    """``load_state_dict``: the saved state of parameter ``i`` (the ``i``-th key of the saved
    param groups) must fit parameter ``i``. Where ``elementwise[i]`` (the class stepping it is
    elementwise) every non-scalar state tensor has the parameter's shape (or its number of
    elements, as a flat shard); matrix optimizers' state (Adafactor's factors) is not checked."""
    keys = [key for group in state_dict["param_groups"] for key in group["params"]]
    if len(keys) != len(params):
        raise ValueError(
            f"load_state_dict: the state holds {len(keys)} parameters but this optimizer has {len(params)}; "
            "load a state saved from the same parameters"
        )
    for index, (key, param) in enumerate(zip(keys, params)):
        if not elementwise[index]:
            continue
        for entry, value in (state_dict["state"].get(key) or {}).items():
            if not torch.is_tensor(value) or value.dim() == 0:
                continue
            if tuple(value.shape) != tuple(param.shape) and value.numel() != param.numel():
                name = f" ({names[index]})" if names[index] else ""
                raise ValueError(
                    f"load_state_dict: parameter #{index}{name} has shape {tuple(param.shape)} here but its saved "
                    f"state {entry!r} has shape {tuple(value.shape)}; load a state saved from the same parameters"
                )
