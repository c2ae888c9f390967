"""``partitioner=ddp_bucket`` on the DDP path without the overlap hooks: the app models DDP's buckets with
its real caps (``zero_lab.ddp_buckets.ddp_bucket_map``), and ZeRO-Adam split along them trains to DDP +
Adam's losses and parameters bitwise."""

from __future__ import annotations

from tests.e2e.runs import REFERENCES, runs_once, session_base, summary

STEPS = ("steps=4", "logger=none")


def test_ddp_bucket_without_overlap_trains_as_ddp_adam_bitwise(tmp_path_factory):
    ours = (*STEPS, "optim=zero_adam", "dp=ddp", "partitioner=ddp_bucket", "partitioner.shard_buckets=true")
    made = runs_once(session_base(tmp_path_factory), {"ddp-bucket": (ours, False), "adam-ddp": REFERENCES["adam-ddp"]})
    zero, ddp = summary(made["ddp-bucket"]), summary(made["adam-ddp"])
    assert zero["losses"] == ddp["losses"] and zero["param_checksum"] == ddp["param_checksum"]
    assert zero["choices"]["partitioner"] == "ddp_bucket" and zero["overlap"] is False
    assert zero["partition"]["imbalance"] < 1.2  # every bucket split across both ranks
