"""``optim=zero_muon dp=zero_lab`` through the real ``python train.py``: the engine steps Muon's hidden
matrices whole on their owners and AdamW on the rest (``optim.param_groups`` is honoured, not dropped),
trains to DDP + the same Muon and AdamW (``optim=muon``) bitwise, and logs each rank's local step."""

from __future__ import annotations

from tests.e2e.runs import summary, train_together

STEPS = ("steps=4", "logger=none")


def test_engine_trains_muon_and_adamw_as_ddp_bitwise(tmp_path):
    ours, theirs = train_together(
        (*STEPS, "optim=zero_muon", "dp=zero_lab", f"hydra.run.dir={tmp_path / 'engine'}"),
        (*STEPS, "optim=muon", f"hydra.run.dir={tmp_path / 'ddp'}"),
    )
    for result in (ours, theirs):
        assert result.returncode == 0, result.stderr[-3000:]
    engine, ddp = summary(tmp_path / "engine"), summary(tmp_path / "ddp")
    assert engine["optimizer_classes"] == ddp["optimizer_classes"] == ["Muon", "AdamW"]
    assert engine["losses"] == ddp["losses"] and engine["param_checksum"] == ddp["param_checksum"]
    assert engine["dp"] == "zero_lab" and engine["engine"]["partitioner"].startswith("SortedGreedy")
    assert engine["choices"]["optim"] == "zero_muon" and len(engine["losses"]) == 4
    assert len(engine["optim_step_s"]) == 2 and all(s > 0 for s in engine["optim_step_s"])  # each rank's
