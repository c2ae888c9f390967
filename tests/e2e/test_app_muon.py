"""Muon through the real ``python train.py`` on the DDP path: a sweep over the partitioner's cost model
(``partitioner.cost=numel,newton_schulz``) trains bitwise as DDP + chained Muon/AdamW (``optim=muon``), and
each rank's local optimizer step is logged and shown by the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.runs import REPO, jobs, metrics, runs_once, summary

#: experiment=muon_lm made small enough for a test (torch's Muon runs Newton–Schulz in bf16, slow on CPU).
MUON_LM = ("model.d_model=64", "model.n_layer=2", "steps=4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """``muon-sweep``: ``experiment=muon_lm`` (smaller) on DDP with ``partitioner.cost=numel,newton_schulz``;
    ``muon-ddp``: the same with ``optim=muon`` (made together, :func:`~tests.e2e.runs.runs_once`)."""
    quiet = ("logger=none",)
    made = {
        "muon-sweep": ((*quiet, "dp=ddp", "experiment=muon_lm", *MUON_LM, "partitioner.cost=numel,newton_schulz"),
                       True),
        "muon-ddp": ((*quiet, "experiment=muon_lm", *MUON_LM, "optim=muon"), False),
    }  # fmt: skip
    return runs_once(tmp_path_factory.getbasetemp() / "test_app_muon", made)


def test_muon_sweep_by_cost_model_matches_ddp_muon_and_reports_the_local_step(runs):
    numel, cost = jobs(runs["muon-sweep"])
    ddp = summary(runs["muon-ddp"])
    by_numel, by_cost = summary(numel), summary(cost)
    assert (by_numel["partition"]["cost"], by_cost["partition"]["cost"]) == ("numel", "newton_schulz")
    # other owners, the same arithmetic: bitwise equal to each other and to DDP + chained Muon/AdamW
    assert by_numel["param_checksum"] == by_cost["param_checksum"] == ddp["param_checksum"]
    assert by_numel["losses"] == by_cost["losses"] == ddp["losses"]
    for run in (numel, cost):
        row = metrics(run)[-1]
        assert {f"time/optim_step_s/{k}" for k in ("rank0", "rank1", "max", "mean")} <= set(row)
        assert row["time/optim_step_s/max"] >= row["time/optim_step_s/mean"] > 0
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(runs["muon-sweep"])], cwd=REPO, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    table = (runs["muon-sweep"] / "report" / "report.md").read_text()
    assert "optim step/rank" in table and "slowest ÷ mean" in table
    for run in (by_numel, by_cost):
        assert " / ".join(f"{1000 * s:.1f}" for s in run["optim_step_s"]) in table  # per-rank local step, ms
