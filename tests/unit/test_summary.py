"""The run summary is stated once (zero_lab/app/record/summary.py): summary.json
round-trips through RunSummary key for key, older summaries still read, and every reader
(objective, W&B, closing lines, report) names keys that exist."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from zero_lab.app.record.catalogue import CATALOGUE, SUMMARY_LISTS
from zero_lab.app.record.closing import closing_lines
from zero_lab.app.record.metrics import FIELDS
from zero_lab.app.record.objective import OBJECTIVES, objective_value
from zero_lab.app.record.summary import PROVENANCE, RunSummary
from zero_lab.app.record.wandb_run import run_summary

FIELD_NAMES = [f.name for f in dataclasses.fields(RunSummary)]


def written(**changes: object) -> dict[str, object]:
    """summary.json as the loop writes it, in its order."""
    values: dict[str, object] = {
        "final_loss": 0.5,
        "losses": [1.0, 0.5],
        "world_size": 2,
        "steps": 2,
        "param_checksum": "ab" * 32,
        "zero": True,
        "optim_state_bytes": [100.0, 90.0],
        "ddp_state_bytes": 190,
        "imbalance": 1.05,
        "step_time_s": 0.02,
        "exchange_time_s": 0.005,
        "exchange_bytes_per_step": 4096.0,
        "exchange_mode": "broadcast",
        "partition": {"imbalance": 1.05},
        "provenance": {"command": "python train.py", "choices": {"optim": "zero_adam"}, "requeued": None},
    }
    return RunSummary(**(values | changes)).as_dict()  # type: ignore[arg-type]


def test_summary_json_round_trips_key_for_key_and_in_order():
    for values in (written(), written(resume_optimizer="override", resume_overridden={"group0.lr": [0.1, 0.2]})):
        text = json.dumps(values)
        assert json.dumps(RunSummary.from_dict(json.loads(text)).as_dict()) == text


def test_optional_keys_are_absent_unless_they_apply():
    plain = written(zero=False, partition=None)
    assert "partition" not in plain and "resume_optimizer" not in plain and "resume_overridden" not in plain
    keys = list(written())
    assert keys.index("partition") < keys.index("command") < keys.index("stopped_by")  # provenance in its place


def test_an_older_summary_reads_with_the_newer_keys_absent():
    old = {"final_loss": 0.5, "losses": [0.5], "world_size": 1, "steps": 1, "retired_key": 3}
    summary = RunSummary.from_dict(old)
    assert summary.optim_step_s is None and summary.choices == {}


def test_every_reader_names_a_key_of_the_summary():
    assert set(OBJECTIVES) <= set(FIELD_NAMES)
    assert {m.name for m in SUMMARY_LISTS} <= set(FIELD_NAMES) and all(m.per_rank for m in SUMMARY_LISTS)
    assert {m.median for m in CATALOGUE if m.median} <= set(FIELD_NAMES)
    assert {m.name for m in CATALOGUE if m.per_rank} <= set(FIELDS)  # each is a RankStep measurement
    assert not set(PROVENANCE) & set(FIELD_NAMES)


def test_objective_wandb_and_closing_lines_read_the_typed_summary(tmp_path: Path):
    summary = RunSummary.from_dict(written())
    assert objective_value(summary, ["final_loss", "optim_state_bytes"]) == [0.5, 100.0]
    shown = run_summary(summary)
    assert shown["memory/optim_state_bytes/max"] == 100.0 and shown["memory/imbalance"] == 1.05
    assert shown["comm/exchange_mode"] == "broadcast"
    lines = closing_lines(summary, "Adam", tmp_path, 1.0)
    assert lines[0].startswith("zero_lab: final loss 0.5 after 2 steps on 2 rank(s)")
    assert "25% of the step" in lines[2]
