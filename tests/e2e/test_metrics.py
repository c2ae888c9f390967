"""Metrics of real runs: every rank's step records, and a real offline W&B run read back from
its ``.wandb`` file (``wandb leet inspect --json``). The record arithmetic: tests/unit/test_metrics.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.e2e.runs import assert_no_leftover_processes, metrics, summary, wandb_records
from tests.unit.test_metrics import PER_RANK


def of_type(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r[kind] for r in records if r["type"] == kind]


# ----------------------------------------------------------------------------- real runs
def test_every_logged_step_has_every_ranks_metrics(default_run):
    rows = metrics(default_run)
    assert len(rows) == 20
    for row in rows:
        for prefix in PER_RANK:
            assert {f"{prefix}/rank0", f"{prefix}/rank1", f"{prefix}/max", f"{prefix}/mean"} <= row.keys()
        assert row["memory/peak_bytes/rank0"] > 0 and row["memory/peak_bytes/rank1"] > 0
        assert row["comm/exchange_bytes/max"] > 0 and row["time/exchange_s/max"] > 0  # ZeRO exchanges
        assert row["train/samples_per_s"] > 0 and row["memory/imbalance"] >= 1.0


def test_wandb_offline_run_holds_every_step_and_the_resolved_config(default_run):
    records = wandb_records(default_run)
    history = [h["item"] for h in of_type(records, "history")]
    losses = summary(default_run)["losses"]
    assert [h["step"] for h in history] == list(range(20))
    assert [h["train/loss"] for h in history] == losses
    assert {"memory/optim_state_bytes/rank0", "memory/optim_state_bytes/rank1"} <= history[-1].keys()
    (run,) = of_type(records, "run")
    config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    resolved = OmegaConf.to_container(OmegaConf.load(default_run / ".hydra" / "config.yaml"), resolve=True)
    assert config == json.loads(json.dumps(resolved))
    assert "optim:zero_adam" in run["tags"] and run["job_type"] == "train"
    assert [e.get("exit_code", 0) for e in of_type(records, "exit")] == [0]  # wandb.finish() ran, cleanly
    assert_no_leftover_processes()  # nor did wandb-core outlive rank 0


def test_sweep_runs_share_one_wandb_group(sweep):
    runs = [of_type(wandb_records(sweep / job), "run")[0] for job in ("0", "1")]
    groups = {run["run_group"] for run in runs}
    assert len(groups) == 1 and groups.pop().startswith("sweep-")
    assert runs[0]["display_name"] != runs[1]["display_name"]


def test_zero_adam_holds_half_of_adams_state_per_rank(sweep):
    adam, zero = summary(sweep / "0"), summary(sweep / "1")
    assert (adam["world_size"], zero["world_size"]) == (2, 2)
    assert adam["optim_state_bytes"][0] == adam["optim_state_bytes"][1]  # every rank holds everything
    for rank in (0, 1):
        assert 0.45 <= zero["optim_state_bytes"][rank] / adam["optim_state_bytes"][rank] <= 0.55
    assert sum(zero["optim_state_bytes"]) == pytest.approx(adam["optim_state_bytes"][0], rel=0.01)
