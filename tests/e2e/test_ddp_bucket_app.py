"""``partitioner=ddp_bucket`` on the DDP path without the overlap hooks: the app models DDP's buckets with
its real caps (``zero_lab.ddp_buckets.ddp_bucket_map``), and ZeRO-Adam split along them trains to DDP +
Adam's losses and parameters bitwise."""

from __future__ import annotations

from tests.e2e.runs import summary, train

STEPS = ("steps=4", "logger=none")


def test_ddp_bucket_without_overlap_trains_as_ddp_adam_bitwise(tmp_path, adam_ddp_run):
    result = train(*STEPS, "optim=zero_adam", "dp=ddp", "partitioner=ddp_bucket", "partitioner.shard_buckets=true",
                   f"hydra.run.dir={tmp_path / 'zero'}")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    zero, ddp = summary(tmp_path / "zero"), summary(adam_ddp_run)
    assert zero["losses"] == ddp["losses"] and zero["param_checksum"] == ddp["param_checksum"]
    assert zero["choices"]["partitioner"] == "ddp_bucket" and zero["overlap"] is False
    assert zero["partition"]["imbalance"] < 1.2  # every bucket split across both ranks
