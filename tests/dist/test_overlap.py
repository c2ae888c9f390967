"""Overlapped ZeRO (DDP comm hooks) on Gloo: every step equals the non-overlapped run from step 1."""

from __future__ import annotations

import pytest

from tests import rank_programs as rp
from zero_lab.partition import Flat

TOL = 1e-6

CASES: dict[str, rp.OverlapCase] = {}
for interleaved in (False, True):
    for shard in (False, True):
        for opt in ("adam", "sgd"):
            name = f"{'interleaved' if interleaved else 'after-all'}-shard{int(shard)}-{opt}-2groups"
            CASES[name] = rp.OverlapCase(optimizer=opt, interleaved=interleaved, shard_buckets=shard, layout="groups")
CASES.update(
    {
        "adamw": rp.OverlapCase(optimizer="adamw", interleaved=True),
        "rmsprop": rp.OverlapCase(optimizer="rmsprop", interleaved=True, shard_buckets=True),
        "adagrad": rp.OverlapCase(optimizer="adagrad"),
        "static-graph": rp.OverlapCase(static_graph=True, interleaved=True),
        "static-graph-after-all": rp.OverlapCase(static_graph=True),
        "no-sync-accumulation": rp.OverlapCase(accumulate=3, interleaved=True),
        "unused-parameter": rp.OverlapCase(
            unused=True, interleaved=True, optimizer="adamw"
        ),  # decay moves a wrongly stepped param
        "flat-partitioner": rp.OverlapCase(partitioner=Flat(), interleaved=True),
        "one-big-bucket": rp.OverlapCase(bucket_cap_mb=25, interleaved=True),
    }
)


@pytest.fixture(scope="module")
def results_w2(world):
    rows = world(rp.overlap_parity, 2, list(CASES.values()))
    return {name: [rank_rows[i] for rank_rows in rows] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_overlap_equals_plain_ddp_and_unoverlapped_zero_from_step_one(results_w2, name):
    for row in results_w2[name]:
        assert row["vs_zero"] <= TOL and row["vs_plain"] <= TOL, (name, row["vs_zero"], row["vs_plain"])
        losses = row["losses"]
        assert losses["overlap"] == pytest.approx(losses["zero"], abs=TOL)
        assert losses["overlap"] == pytest.approx(losses["plain"], abs=TOL)
        assert losses["overlap"][1] != losses["overlap"][0]  # the first update was applied


def test_three_ranks_both_hooks(world):
    cases = [rp.OverlapCase(interleaved=True, shard_buckets=True, layout="groups"), rp.OverlapCase(optimizer="sgd")]
    for rank_rows in world(rp.overlap_parity, 3, cases):
        for row in rank_rows:
            assert row["vs_zero"] <= TOL and row["vs_plain"] <= TOL


def test_trainability_change_raises_clearly(world):
    for message in world(rp.overlap_trainability_change, 2, timeout_s=60):
        assert "trainability changed while overlap_with_ddp=True" in message


def test_a_model_with_an_overlap_hook_is_freed(single_rank_group):
    """DDP's C++ reducer holds the hook; nothing the hook holds may lead back to DDP, or
    the cycle (invisible to the garbage collector) keeps model and optimizer alive."""
    import gc
    import weakref

    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zero_lab import ZeroRedundancyOptimizer
    from zero_lab.overlap import hook_with_zero_step_interleaved

    def train_one_step() -> list[weakref.ref]:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        ddp = DDP(model)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-3)
        ddp.register_comm_hook(None, hook_with_zero_step_interleaved(allreduce_hook, ddp, opt))
        ddp(torch.randn(3, 4)).sum().backward()
        return [weakref.ref(model), weakref.ref(ddp), weakref.ref(opt)]

    refs = train_one_step()
    gc.collect()
    assert [ref() is None for ref in refs] == [True, True, True]
