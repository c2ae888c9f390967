"""The memory planner's prediction equals what real Gloo runs hold, per rank, at W = 1, 2, 3."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import Flat, Partitioner, SortedGreedy
from zero_lab.planner import plan_memory, specs_from_module

# name -> (partitioner or None for the plain optimizer, optimizer class, its kwargs, use torch's ZeRO)
CASES: dict[str, tuple[Partitioner | None, type[torch.optim.Optimizer], dict[str, Any], bool]] = {
    "plain_adam": (None, torch.optim.Adam, {"lr": 1e-2}, False),
    "sorted_greedy_adam": (SortedGreedy(), torch.optim.Adam, {"lr": 1e-2}, False),
    "flat_adam": (Flat(), torch.optim.Adam, {"lr": 1e-2}, False),
    "sorted_greedy_sgd_momentum": (SortedGreedy(), torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}, False),
    "flat_adamw_amsgrad": (Flat(), torch.optim.AdamW, {"lr": 1e-2, "amsgrad": True}, False),
    "torch_zero_adam": (SortedGreedy(), torch.optim.Adam, {"lr": 1e-2}, True),
}


def make_model() -> nn.Module:
    """Parameters of varied sizes (so partitions are uneven and flat cuts some), one frozen."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 7), nn.Linear(7, 24), nn.Tanh(), nn.Linear(24, 5), nn.Linear(5, 3))
    model[3].bias.requires_grad_(False)
    return model


def measure_rank(steps: int = 2) -> dict[str, dict[str, int]]:
    """On every rank: each case's real optimizer-state, parameter and gradient bytes after ``steps``."""
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    template = make_model()
    tokens = torch.arange(12) % 50  # the same batch on every rank, so replicas stay equal without DDP
    out = {}
    for name, (partitioner, optimizer_class, kwargs, torch_zero) in CASES.items():
        model = copy.deepcopy(template)
        if partitioner is None:
            optimizer = optimizer_class(model.parameters(), **kwargs)
        elif torch_zero:
            optimizer = TorchZero(model.parameters(), optimizer_class, **kwargs)
        else:
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class, partitioner=partitioner, **kwargs)
        for _ in range(steps):
            optimizer.zero_grad()
            model(tokens).pow(2).mean().backward()
            optimizer.step()
        out[name] = {
            "state_bytes": optimizer_state_bytes(optimizer),
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None),
        }
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_prediction_equals_real_run(world, world_size: int) -> None:
    measured = world(measure_rank, world_size)
    specs = specs_from_module(make_model())
    for name, (partitioner, optimizer_class, kwargs, _) in CASES.items():
        plan = plan_memory(specs, world_size, partitioner, optimizer_class, **kwargs)
        for rank, result in enumerate(measured):
            predicted = plan.ranks[rank]
            got = result[name]
            assert (predicted.state_bytes, predicted.param_bytes, predicted.grad_bytes) == (
                got["state_bytes"],
                got["param_bytes"],
                got["grad_bytes"],
            ), f"{name}, rank {rank} of {world_size}"
