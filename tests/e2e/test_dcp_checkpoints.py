"""``checkpoint_format=dcp`` (issue 28): the app writes torch.distributed.checkpoint directories,
and resumes them exactly — with another partitioner, and into a plain optimizer."""

from __future__ import annotations

import pytest

from tests.e2e.runs import assert_close, run_once, runs_once, summary


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "test_dcp_checkpoints"
    args = ("logger=none", "optim=zero_adam", "steps=4", "checkpoint_every=2", "checkpoint_format=dcp")
    return base, run_once(base, "saved", *args)


def test_dcp_checkpoints_resume_exactly_with_another_partitioner_and_into_plain_adam(saved):
    base, run = saved
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000002.dcp", "step_00000004.dcp"]
    assert {p.name for p in (checkpoints / "step_00000002.dcp").iterdir()} >= {".metadata", "zero_lab.json"}
    source = f"resume={checkpoints / 'step_00000002.dcp'}"
    resumed = runs_once(
        base,
        {
            "flat": (("logger=none", "optim=zero_adam", "partitioner=flat", "steps=4", source,
                      "checkpoint_every=1", "checkpoint_format=dcp", "keep_checkpoints=1"), False),
            "plain": (("logger=none", "optim=adam", "steps=4", source), False),
        },
    )  # fmt: skip
    original, flat, plain = summary(run), summary(resumed["flat"]), summary(resumed["plain"])
    assert flat["start_step"] == plain["start_step"] == 2
    assert flat["losses"] == original["losses"]  # bit for bit, Flat partitioner after SortedGreedy
    assert flat["param_checksum"] == original["param_checksum"]
    assert_close(plain["losses"], original["losses"])
    assert sorted(p.name for p in (resumed["flat"] / "checkpoints").iterdir()) == ["step_00000004.dcp"]
