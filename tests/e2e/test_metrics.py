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


def wandb_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's final summary: every summary record's update, in order."""
    merged: dict[str, Any] = {}
    for item in of_type(records, "summary"):
        merged.update(item.get("update") or {})
    return merged


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in leaves(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def test_wandb_offline_run_holds_every_step(default_run):
    records = wandb_records(default_run)
    history = [h["item"] for h in of_type(records, "history")]
    losses = summary(default_run)["losses"]
    assert [h["step"] for h in history] == list(range(20))
    assert [h["train/loss"] for h in history] == losses
    assert {"memory/optim_state_bytes/rank0", "memory/tensor_bytes/rank1"} <= history[-1].keys()
    assert [e.get("exit_code", 0) for e in of_type(records, "exit")] == [0]  # wandb.finish() ran, cleanly
    assert_no_leftover_processes()  # nor did wandb-core outlive rank 0


def test_wandb_config_is_the_resolved_config_without_hydra_machinery_plus_the_chosen_options(default_run):
    (run,) = of_type(wandb_records(default_run), "run")
    config = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
    resolved = OmegaConf.to_container(OmegaConf.load(default_run / ".hydra" / "config.yaml"), resolve=True)
    assert not [k for k in config if k.rsplit(".", 1)[-1] in ("_target_", "_partial_", "_convert_")]
    assert not [k for k, v in config.items() if isinstance(v, dict)]  # flat keys, as filters name them
    assert (config["optim"], config["partitioner"], config["model"], config["logger"]) == (
        "zero_adam",
        "sorted_greedy",
        "mlp",
        "wandb",
    )
    assert config["optim.optimizer_class"] == "torch.optim.Adam"  # not {_target_: hydra.utils.get_class, ...}
    expected = {
        key: value
        for key, value in leaves(json.loads(json.dumps(resolved))).items()
        if not key.startswith(("logger.", "optim.optimizer_class"))
        and not key.endswith(("_target_", "_partial_", "_convert_"))
    }
    assert {k: config[k] for k in expected} == expected  # every value of the resolved config, under its dotted key
    assert "logger.group" not in config and None not in [v for k, v in config.items() if k.startswith("logger.")]
    assert config["logger.tags"] == run["tags"] and "optim:zero_adam" in run["tags"] and run["job_type"] == "train"


def test_wandb_summary_holds_per_rank_bytes_imbalance_state_vs_ddp_and_the_exchange(sweep):
    for job in ("0", "1"):
        values, expected = wandb_summary(wandb_records(sweep / job)), summary(sweep / job)
        for rank in (0, 1):
            assert values[f"memory/optim_state_bytes/rank{rank}"] == expected["optim_state_bytes"][rank]
            assert values[f"memory/tensor_bytes/rank{rank}"] == expected["tensor_bytes"][rank]
        assert values["memory/optim_state_bytes/min"] == min(expected["optim_state_bytes"])
        assert values["memory/imbalance"] == expected["imbalance"]
        assert values["memory/state_vs_ddp"] == pytest.approx(expected["state_vs_ddp"])
        assert values["final_loss"] == expected["final_loss"]
    zero = wandb_summary(wandb_records(sweep / "1"))
    assert 0.49 < zero["memory/state_vs_ddp"] < 0.52
    assert zero["comm/exchange_mode"] == summary(sweep / "1")["exchange_mode"] is not None


def test_sweep_runs_share_one_wandb_group_and_are_named_and_tagged_by_their_overrides(sweep):
    runs = [of_type(wandb_records(sweep / job), "run")[0] for job in ("0", "1")]
    groups = {run["run_group"] for run in runs}
    assert len(groups) == 1 and groups.pop().startswith("sweep-")
    for run, optim in zip(runs, ("adam", "zero_adam")):
        config = run["config"]["update"]
        assert (config["logger.group"], config["logger.name"]) == (run["run_group"], run["display_name"])
        assert f"optim={optim}" in run["display_name"].split(",") and config["optim"] == optim
        assert {f"optim:{optim}", "steps:6", "checkpoint_every:3", "world_size:2"} <= set(run["tags"])


def test_the_terminal_says_where_the_offline_run_is_and_how_to_sync_it(default_run):
    printed = (default_run / ".done").read_text()  # the run's stdout
    (wandb_file,) = default_run.glob("wandb/offline-run-*/run-*.wandb")
    assert f"zero_lab: W&B run (offline): {wandb_file.parent}" in printed
    assert f"wandb sync {wandb_file.parent}" in printed


def test_tensor_bytes_are_params_grads_and_state_and_ddp_state_is_planned_right(sweep):
    adam, zero = summary(sweep / "0"), summary(sweep / "1")
    params = adam["model_params"]  # float32 MLP, no buffers: params + grads = 8 bytes per parameter
    assert adam["tensor_bytes"] == [8 * params + state for state in adam["optim_state_bytes"]]
    assert zero["dp"] == "zero_lab"  # dp=auto: the engine releases every gradient with the step (ZeRO-2)
    assert zero["tensor_bytes"] == [4 * params + state for state in zero["optim_state_bytes"]]
    assert adam["ddp_state_bytes"] == zero["ddp_state_bytes"] == adam["optim_state_bytes"][0]  # plan == measured


def test_zero_adam_holds_half_of_adams_state_per_rank(sweep):
    adam, zero = summary(sweep / "0"), summary(sweep / "1")
    assert (adam["world_size"], zero["world_size"]) == (2, 2)
    assert adam["optim_state_bytes"][0] == adam["optim_state_bytes"][1]  # every rank holds everything
    for rank in (0, 1):
        assert 0.45 <= zero["optim_state_bytes"][rank] / adam["optim_state_bytes"][rank] <= 0.55
    assert sum(zero["optim_state_bytes"]) == pytest.approx(adam["optim_state_bytes"][0], rel=0.01)
