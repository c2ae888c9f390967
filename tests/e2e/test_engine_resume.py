"""``dp=zero_lab`` through the real ``python train.py``: gradient clipping (``optim.max_grad_norm``) trains to
DDP + Adam's clipped losses and parameters bitwise, and a run resumed from its native or DCP checkpoint at
step 3 ends as the uninterrupted run, bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.runs import REFERENCES, runs_once, session_base, summary, train_together

ENGINE = ("steps=6", "logger=none", "optim=zero_adam", "dp=zero_lab", "checkpoint_every=3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Run dirs by name: ``native`` (clipped) and ``dcp`` (flat, DCP checkpoints), 6 steps with checkpoints
    every 3, made together with the session's clipped DDP + Adam (``ddp``, :func:`~tests.e2e.runs.runs_once`);
    then each resumed from its step-3 checkpoint (``native-resumed``, ``dcp-resumed``)."""
    first = runs_once(
        session_base(tmp_path_factory),
        {
            "engine-resume-native": ((*ENGINE, "optim.max_grad_norm=0.05"), False),
            "engine-resume-dcp": ((*ENGINE, "partitioner=flat", "checkpoint_format=dcp"), False),
            "adam-clipped": REFERENCES["adam-clipped"],
        },
    )
    out = {"native": first["engine-resume-native"], "dcp": first["engine-resume-dcp"], "ddp": first["adam-clipped"]}
    base = tmp_path_factory.mktemp("engine_resume")
    out |= {"native-resumed": base / "native-resumed", "dcp-resumed": base / "dcp-resumed"}
    resumed = train_together(
        (*ENGINE, "optim.max_grad_norm=0.05", f"resume={out['native'] / 'checkpoints' / 'step_00000003'}",
         f"hydra.run.dir={out['native-resumed']}"),
        (*ENGINE, "partitioner=flat", "checkpoint_format=dcp",
         f"resume={out['dcp'] / 'checkpoints' / 'step_00000003.dcp'}", f"hydra.run.dir={out['dcp-resumed']}"),
    )  # fmt: skip
    for result in resumed:
        assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_clipped_engine_trains_as_clipped_ddp_bitwise(runs):
    ours, theirs = summary(runs["native"]), summary(runs["ddp"])
    assert ours["losses"] == theirs["losses"] and ours["param_checksum"] == theirs["param_checksum"]


@pytest.mark.parametrize("form", ["native", "dcp"])
def test_resumed_engine_run_ends_as_the_uninterrupted_one(runs, form):
    uninterrupted, resumed = summary(runs[form]), summary(runs[f"{form}-resumed"])
    assert resumed["start_step"] == 3
    assert resumed["losses"][-3:] == uninterrupted["losses"][-3:]
    assert resumed["param_checksum"] == uninterrupted["param_checksum"]
