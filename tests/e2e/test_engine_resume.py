"""``dp=zero_lab`` through the real ``python train.py``: gradient clipping (``optim.max_grad_norm``) trains to
DDP + Adam's clipped losses and parameters bitwise, and a run resumed from its native or DCP checkpoint at
step 3 ends as the uninterrupted run, bitwise."""

from __future__ import annotations

import pytest

from tests.e2e.runs import summary, train_together

ENGINE = ("steps=6", "logger=none", "optim=zero_adam", "dp=zero_lab", "checkpoint_every=3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("engine_resume")
    first = train_together(
        (*ENGINE, "optim.max_grad_norm=0.05", f"hydra.run.dir={base / 'native'}"),
        (*ENGINE, "partitioner=flat", "checkpoint_format=dcp", f"hydra.run.dir={base / 'dcp'}"),
    )
    resumed = train_together(
        (*ENGINE, "optim.max_grad_norm=0.05", f"resume={base / 'native' / 'checkpoints' / 'step_00000003'}",
         f"hydra.run.dir={base / 'native-resumed'}"),
        (*ENGINE, "partitioner=flat", "checkpoint_format=dcp",
         f"resume={base / 'dcp' / 'checkpoints' / 'step_00000003.dcp'}", f"hydra.run.dir={base / 'dcp-resumed'}"),
    )  # fmt: skip
    for result in (*first, *resumed):
        assert result.returncode == 0, result.stderr[-3000:]
    return base


def test_clipped_engine_trains_as_clipped_ddp_bitwise(runs, clipped_adam_run):
    ours, theirs = summary(runs / "native"), summary(clipped_adam_run)
    assert ours["losses"] == theirs["losses"] and ours["param_checksum"] == theirs["param_checksum"]


@pytest.mark.parametrize("form", ["native", "dcp"])
def test_resumed_engine_run_ends_as_the_uninterrupted_one(runs, form):
    uninterrupted, resumed = summary(runs / form), summary(runs / f"{form}-resumed")
    assert resumed["start_step"] == 3
    assert resumed["losses"][-3:] == uninterrupted["losses"][-3:]
    assert resumed["param_checksum"] == uninterrupted["param_checksum"]
