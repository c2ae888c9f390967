"""``grad_reduce=`` / ``shard_grads=`` through the real ``python train.py``: ZeRO-Adam with a
point-to-point reduce-scatter and ZeRO-2 gradient memory beside plain DDP + Adam with its
all-reduce metered; summary.json and W&B hold the bytes each phase sent, per rank."""

from __future__ import annotations

import pytest

from tests.e2e.runs import summary, train_together, wandb_records
from tests.e2e.test_metrics import wandb_summary

STEPS = ("steps=3",)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("grad_reduce")
    zero, ddp = train_together(
        (
            *STEPS,
            "optim=zero_adam",
            "grad_reduce=reduce_scatter",
            "shard_grads=true",
            "partitioner=flat",
            "bucket_view=true",
            "exchange=broadcast",
            "logger=wandb",
            f"hydra.run.dir={base / 'zero'}",
        ),
        (*STEPS, "optim=adam", "grad_reduce=all_reduce", "logger=none", f"hydra.run.dir={base / 'ddp'}"),
    )
    assert zero.returncode == 0, zero.stderr[-3000:]
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    return base


def test_reduce_scatter_and_exchange_send_what_ddps_all_reduce_sends(runs):
    zero, ddp = summary(runs / "zero"), summary(runs / "ddp")
    assert zero["grad_reduce"]["strategy"] == "reduce_scatter" and ddp["grad_reduce"]["strategy"] == "all_reduce"
    ddp_bytes = ddp["bytes_per_step"]["grad_reduce"]
    assert ddp["bytes_per_step"]["param_exchange"] is None  # a plain optimizer exchanges nothing
    for rank in range(zero["world_size"]):
        ours = zero["bytes_per_step"]["grad_reduce"][rank] + zero["bytes_per_step"]["param_exchange"][rank]
        assert 0 < ours <= 1.02 * ddp_bytes[rank]
    phases = zero["phase_time_s"]
    assert phases["grad_reduce"] > 0 and phases["param_exchange"] > 0
    assert phases["grad_reduce_exposed"] >= 0 and 0 <= phases["param_exchange_exposed"] <= phases["param_exchange"]


def test_shard_grads_holds_a_share_of_ddps_gradient_bytes(runs):
    zero, ddp = summary(runs / "zero"), summary(runs / "ddp")
    psi = ddp["grad_bytes"][0] / 2  # DDP holds every param.grad and a bucket copy of them: 2Ψ, measured
    assert zero["shard_grads"] is True and ddp["grad_bytes"] == [2 * psi] * ddp["world_size"]
    assert all(held < psi for held in zero["grad_bytes"])  # owned gradients only: DDP's buckets are freed
    assert sum(zero["grad_bytes"]) <= psi * 1.5  # Flat: a parameter cut by two ranks is held whole by both


def test_wandb_summary_holds_the_bytes_by_phase(runs):
    values = wandb_summary(wandb_records(runs / "zero"))
    got = summary(runs / "zero")["bytes_per_step"]
    for phase in ("grad_reduce", "param_exchange"):
        assert values[f"comm/bytes_per_step/{phase}/rank1"] == got[phase][1]
    assert values["comm/grad_reduce"] == "reduce_scatter"
    assert values["memory/grad_bytes/rank0"] == summary(runs / "zero")["grad_bytes"][0]
