"""The Muon benchmark's arithmetic, without processes: owners' cost imbalance and the summary."""

from __future__ import annotations

import pytest

from zero_lab.bench.muon import MODEL, lm, partition_costs, render, summarize


def test_the_benchmark_model_and_its_owners():
    assert sum(p.numel() for p in lm(MODEL).parameters()) == 1_153_472  # head tied: counted once
    model_order = partition_costs(MODEL, 2, "model")
    assert round(model_order["numel"], 3) == 1.934 and round(model_order["newton_schulz"], 3) == 1.0
    assert round(partition_costs(MODEL, 2, "muon_first")["numel"], 4) == 1.0076


def test_summary_takes_medians_and_the_slowest_rank():
    def rank(local, iteration, step):
        return {"s": {"local_s": local, "iteration_s": iteration, "step_s": step, "state_bytes": 1024, "max_diff": 0.0}}

    per_rank = [
        rank([0.1, 0.3, 0.2], [1.0, 1.2, 1.1], [0.15, 0.35, 0.25]),
        rank([0.1, 0.1, 0.2], [0.9, 1.3, 1.0], [0.1, 0.1, 0.2]),
    ]
    row = summarize(per_rank, ["s"])["s"]
    assert row["local_ms"] == pytest.approx([200.0, 100.0])
    assert row["slowest_over_mean"] == pytest.approx(1.0)  # per step: 1.0, 1.5, 1.0 -> median 1.0
    assert row["iteration_ms"] == pytest.approx(1100.0)  # slowest per step: 1.0, 1.3, 1.1
    assert row["exchange_ms"] == pytest.approx(50.0)  # rank 0: step - local = 0.05 each step
    costs = {"numel": 1.5, "newton_schulz": 1.0, "cpu_step_ns": 1.1, "cpu_step_ns_by_model": 1.0}
    shown = render(2, {"ddp_muon": row}, costs)
    assert "numel-balanced 1.500, cost-balanced 1.000, cpu_step_ns-balanced 1.100 (by its own model 1.000)" in shown
    assert "| DDP + Muon/AdamW | 200.0 / 100.0 | 1.00 | 1100.0 | 1.00 |" in shown
