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

__all__ = ["merge_states", "slice_state"]

State = dict[str, Any]


def _is_elementwise(value: Any, shape: Sequence[int]) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) == tuple(shape)


def slice_state(state: State, shape: Sequence[int], start: int, stop: int) -> State:
    """The state of elements ``[start, stop)`` of a parameter of ``shape``.

    A full range returns the entries unchanged (parameter-shaped); a partial range
    returns elementwise entries as 1-D clones of the slice.
    """
    numel = 1
    for size in shape:
        numel *= size
    if start == 0 and stop == numel:
        return dict(state)
    return {
        key: value.reshape(-1)[start:stop].clone() if _is_elementwise(value, shape) else value
        for key, value in state.items()
    }


def merge_states(pieces: Sequence[tuple[tuple[int, int], State]], shape: Sequence[int]) -> State:
    """Glue the states of the pieces ``((start, stop), state)`` that tile a parameter.

    Elementwise entries of partial pieces are 1-D; they are concatenated in element
    order and reshaped to ``shape``. Other entries are taken from the first piece.
    """
    ordered = sorted(pieces, key=lambda piece: piece[0][0])
    if len(ordered) == 1:
        return dict(ordered[0][1])
    merged: State = {}
    for key, value in ordered[0][1].items():
        (start, stop) = ordered[0][0]
        if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == stop - start:
            merged[key] = torch.cat([state[key].reshape(-1) for _, state in ordered]).reshape(tuple(shape))
        else:
            merged[key] = value
    return merged
