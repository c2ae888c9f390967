"""Cutting a parameter's optimizer state into element ranges and gluing it back.

The optimizer state of a shard ``[start, stop)`` of a parameter is the state of the
full parameter restricted to those flattened elements. A state entry is *elementwise*
when it is a tensor shaped like the parameter (``exp_avg``, ``momentum_buffer``...);
anything else (``step``, scalars) is the same for every piece. This is all that
consolidation, flat ranges and resharding need, and it is pure tensor code::

    piece = slice_state({"exp_avg": torch.ones(4, 3), "step": torch.tensor(5.0)}, (4, 3), 2, 7)
    whole = merge_states([((2, 7), piece), ...], (4, 3))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["merge_states", "reslice", "restrict_state", "slice_state"]

State = dict[str, Any]


def slice_state(state: State, shape: Sequence[int], start: int, stop: int) -> State:
    """The state of elements ``[start, stop)`` of a parameter whose full state is ``state``.

    A full range returns the entries unchanged (parameter-shaped); a partial range
    returns elementwise entries as 1-D clones of the slice.
    """
    if (start, stop) == (0, _numel(shape)):
        return dict(state)
    return reslice([((0, _numel(shape)), state)], shape, (start, stop)) or {}


def merge_states(pieces: Sequence[tuple[tuple[int, int], State]], shape: Sequence[int]) -> State:
    """Glue the states of pieces ``((start, stop), state)`` that tile a parameter."""
    if len(pieces) == 1:
        return dict(pieces[0][1])
    return reslice(pieces, shape, (0, _numel(shape))) or {}


def _numel(shape: Sequence[int]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def restrict_state(
    state: State, piece: tuple[int, int], shape: Sequence[int], want: tuple[int, int]
) -> tuple[tuple[int, int], State] | None:
    """The part of a piece's state (elements ``piece`` of a parameter) inside ``want``.

    Returns ``((lo, hi), state)`` for the intersection, elementwise entries as 1-D
    clones, or ``None`` when they do not overlap.
    """
    lo, hi = max(piece[0], want[0]), min(piece[1], want[1])
    if hi <= lo:
        return None
    length = piece[1] - piece[0]
    whole = piece == (0, _numel(shape))
    out: State = {}
    for key, value in state.items():
        elementwise = (
            isinstance(value, torch.Tensor)
            and value.dim() > 0
            and (tuple(value.shape) == tuple(shape) if whole else (value.dim() == 1 and value.numel() == length))
        )
        out[key] = value.reshape(-1)[lo - piece[0] : hi - piece[0]].clone() if elementwise else value
    return (lo, hi), out


def reslice(
    pieces: Sequence[tuple[tuple[int, int], State]], shape: Sequence[int], want: tuple[int, int]
) -> State | None:
    """The state of elements ``want`` of a parameter, from saved pieces covering them.

    ``pieces`` are ``((start, stop), state)`` as saved by any partition; the result is
    shaped as a shard of ``want`` would be (parameter-shaped when ``want`` is the whole
    parameter, 1-D otherwise). ``None`` when no piece has state for these elements.
    """
    parts = [part for state_range, state in pieces if (part := restrict_state(state, state_range, shape, want))]
    if not parts:
        return None
    covered = sum(hi - lo for (lo, hi), _ in parts)
    if covered != want[1] - want[0]:
        raise ValueError(f"saved state covers {covered} of the {want[1] - want[0]} elements {want}")
    whole = want == (0, _numel(shape))
    target = tuple(shape) if whole else (want[1] - want[0],)
    ordered = sorted(parts, key=lambda part: part[0][0])
    merged: State = {}
    for key, value in ordered[0][1].items():
        (lo, hi) = ordered[0][0]
        if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == hi - lo:
            merged[key] = torch.cat([state[key].reshape(-1) for _, state in ordered]).reshape(target)
        else:
            merged[key] = value
    return merged
