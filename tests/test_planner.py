"""The memory planner: pure predictions, and equality with what real Gloo runs hold at W = 1, 2, 3."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.partition import Flat, ParamSpec, Partitioner, SortedGreedy
from zero_lab.planner import plan_memory, probe_state_rule, specs_from_module

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


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    local = getattr(optimizer, "optim", optimizer)
    return sum(v.numel() * v.element_size() for s in local.state.values() for v in s.values() if torch.is_tensor(v))


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
            "state_bytes": _state_bytes(optimizer),
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


def test_probe_reads_state_layouts() -> None:
    adam = probe_state_rule(torch.optim.Adam, lr=1e-3)
    assert adam.per_element == (("exp_avg", 4), ("exp_avg_sq", 4)) and adam.fixed == (("step", 4),)
    assert adam.nbytes(10) == 84
    assert probe_state_rule(torch.optim.Adam, torch.bfloat16, lr=1e-3).per_element == (
        ("exp_avg", 2),
        ("exp_avg_sq", 2),
    )
    assert probe_state_rule(torch.optim.Adam, lr=1e-3, amsgrad=True).nbytes(1) == 16
    assert probe_state_rule(torch.optim.SGD, lr=1e-3, momentum=0.9).per_element == (("momentum_buffer", 4),)
    assert probe_state_rule(torch.optim.SGD, lr=1e-3).nbytes(1000) == 0


def test_flat_at_thousands_of_ranks_prices_every_shard() -> None:
    specs = [ParamSpec(numel=n) for n in (4_000_000, 1_000_003, 2_000, 7)]
    plan = plan_memory(specs, 4096, Flat(), torch.optim.Adam, lr=1e-3)
    shards = len(plan.partition.shards)
    assert sum(r.state_bytes for r in plan.ranks) == 8 * sum(s.numel for s in specs) + 4 * shards
    assert plan.imbalance == pytest.approx(1.0, abs=1e-3)
    ddp = plan_memory(specs, 4096, None, torch.optim.Adam, lr=1e-3)
    assert {r.state_bytes for r in ddp.ranks} == {8 * sum(s.numel for s in specs) + 4 * len(specs)}


def test_sorted_greedy_numel_matches_partition_report() -> None:
    specs = [ParamSpec(numel=n) for n in (900, 500, 400, 300, 300, 10)]
    plan = plan_memory(specs, 3, SortedGreedy(), torch.optim.SGD, lr=0.1, momentum=0.9)
    report = plan.partition.report()
    assert tuple(r.state_numel for r in plan.ranks) == report.numel_per_rank
    assert tuple(r.state_bytes for r in plan.ranks) == report.bytes_per_rank  # momentum: 4 B per fp32 element
    assert plan.imbalance == pytest.approx(report.imbalance)


def test_frozen_parameters_hold_no_state_but_count_as_parameters() -> None:
    specs = [ParamSpec(numel=100), ParamSpec(numel=50, trainable=False)]
    rank = plan_memory(specs, 1, SortedGreedy(), torch.optim.Adam, lr=1e-3).ranks[0]
    assert (rank.param_bytes, rank.grad_bytes, rank.state_bytes) == (600, 400, 804)


def test_master_weights_price_fp32_masters_and_state() -> None:
    specs = [ParamSpec(numel=1000, itemsize=2, kind="cpu/torch.bfloat16")]
    plan = plan_memory(specs, 2, Flat(), torch.optim.Adam, master_weights=True, lr=1e-3)
    assert [r.master_bytes for r in plan.ranks] == [2000, 2000]
    assert [r.state_bytes for r in plan.ranks] == [4004, 4004]


def test_specs_from_a_meta_module_cost_nothing_and_dedupe_tied_weights() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(32_000, 1024), nn.Linear(1024, 32_000, bias=False))
    model[1].weight = model[0].weight
    specs = specs_from_module(model)
    assert [s.numel for s in specs] == [32_000 * 1024]
    assert specs[0].kind == "cpu/torch.float32" and specs[0].name == "0.weight"
    plan = plan_memory(specs, 1024, Flat(), torch.optim.Adam, lr=1e-3)
    assert max(r.state_bytes for r in plan.ranks) == 8 * 32_000 + 4


def test_plan_table_and_dict() -> None:
    plan = plan_memory([ParamSpec(numel=10), ParamSpec(numel=6)], 2, SortedGreedy(), torch.optim.Adam, lr=1e-3)
    assert "state" in plan.table() and "max" in plan.table()
    data = plan.as_dict(per_rank=True)
    assert data["summary"]["state_bytes"]["max"] == 84 and len(data["ranks"]) == 2
