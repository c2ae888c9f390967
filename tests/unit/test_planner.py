"""The memory planner's pure predictions (equality with real runs: tests/dist/test_planner_prediction.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zero_lab.partition import Flat, ParamSpec, SortedGreedy
from zero_lab.planner import plan_memory, probe_state_rule, specs_from_module


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
