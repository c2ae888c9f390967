"""DDP's options as ``dist.`` keys (no processes): what is refused before start and what is said."""

from __future__ import annotations

import pytest

from tests.preflight import compose_job, preflight
from zero_lab.app.check.notices import notices
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.plan.run_plan import RunPlan


def test_ddp_options_are_typed_keys_with_ddps_defaults():
    cfg, _, _ = compose_job([])
    assert (cfg.dist.find_unused_parameters, cfg.dist.static_graph, cfg.dist.broadcast_buffers) == (False, False, True)
    assert cfg.dist.sync_batchnorm is False
    cfg, _, _ = compose_job(["dist.find_unused_parameters=true", "dist.static_graph=true"])
    assert cfg.dist.find_unused_parameters and cfg.dist.static_graph


def test_sync_batchnorm_is_refused_on_cpu_saying_why():
    with pytest.raises(ConfigError) as caught:
        preflight(["dist.sync_batchnorm=true"])
    assert "dist.sync_batchnorm=true: torch's SyncBatchNorm runs on GPUs only; use dist=cuda" in str(caught.value)


def test_ddp_bucket_on_a_model_of_one_bucket_says_rank_0_keeps_all_state():
    overrides = ["overlap=true", "partitioner=ddp_bucket", "model.hidden=64"]
    cfg, _ = preflight(overrides)
    (note,) = notices(cfg, overrides, RunPlan.of(cfg))
    assert note.startswith("partitioner=ddp_bucket: the model's trainable parameters fit 1 DDP bucket(s)")
    assert "1 of 2 ranks hold no optimizer state and rank 0 keeps all of it (÷ 1.00)" in note
    assert "partitioner.shard_buckets=true" in note
    sharded = [*overrides, "partitioner.shard_buckets=true"]
    cfg, _ = preflight(sharded)
    assert notices(cfg, sharded, RunPlan.of(cfg)) == []


def test_all_gather_with_overlap_is_refused_naming_both_keys():
    with pytest.raises(ConfigError) as caught:
        preflight(["overlap=true", "exchange=all_gather"])
    assert "exchange=all_gather: with overlap=true the exchange is per DDP bucket by broadcast" in str(caught.value)
    assert preflight(["overlap=true", "exchange=broadcast"])[0].exchange == "broadcast"
