"""The core's API checked at the call on a real world: ranks constructed with different
parameters all raise a ``ValueError`` naming the first difference (no deadlock, no abort at
the first step), and ``consolidate_state_dict(to=W)`` is refused on every rank."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

from zero_lab import ZeroRedundancyOptimizer


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("shape", r"parameter #0 is \(48, 32\) float32 on rank 0 but \(64, 32\) float32 on rank 1"),
        ("dtype", r"parameter #0 is \(48,\) float32 on rank 0 but \(48,\) float64 on rank 1"),
        ("dtype_all", r"parameter #0 is \(48, 32\) float32 on rank 0 but \(48, 32\) float64 on rank 1"),
        ("count", r"different numbers of parameters \(rank 0: 2, rank 1: 1\)"),
    ],
)
def test_ranks_with_different_parameters_all_raise_naming_the_difference(world, layout, expected):
    messages = world(construct_with_rank_dependent_params, 2, layout)
    assert len(messages) == 2
    for rank, message in enumerate(messages):
        assert message.startswith(f"ValueError: ZeroRedundancyOptimizer on rank {rank}:"), message
        assert re.search(expected, message), message


def test_consolidate_to_a_missing_rank_is_refused_on_every_rank(world):
    assert world(consolidate_to, 2, 2) == ["ValueError: consolidate_state_dict(to=2): to must be a rank"] * 2


# ---------------------------------------------------------------- rank programs
def construct_with_rank_dependent_params(layout: str) -> str:
    """Rank 1 builds a different model; return the error each rank got."""
    rank = dist.get_rank()
    if layout == "shape":
        params = [torch.nn.Parameter(torch.zeros(48 if rank == 0 else 64, 32))]
    elif layout.startswith("dtype"):  # zero_lab keeps one dtype per optimizer: all of rank 1's differ
        dtype = torch.float64 if rank == 1 else torch.float32
        params = [
            torch.nn.Parameter(torch.zeros(48, 32, dtype=dtype)),
            torch.nn.Parameter(torch.zeros(48, dtype=dtype)),
        ]
        if layout == "dtype":
            params = params[1:]
    else:
        params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(2 - rank)]
    try:
        ZeroRedundancyOptimizer(params, torch.optim.SGD, lr=0.1)
    except ValueError as error:
        return f"ValueError: {error}"
    return "constructed"


def consolidate_to(to: int) -> str:
    opt = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.zeros(4))], torch.optim.Adam, lr=1e-3)
    try:
        opt.consolidate_state_dict(to=to)
    except ValueError as error:
        return f"ValueError: {str(error)[: len('consolidate_state_dict(to=2): to must be a rank')]}"
    return "consolidated"
