"""Element-granular flat partitions, sharded gradient clipping and fp32 master shards (Gloo)."""

from __future__ import annotations

import pytest
import torch

from tests import rank_programs as rp
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.partition import Flat

INF = float("inf")


@pytest.mark.parametrize("world_size", [2, 3])
def test_flat_balances_an_embedding_heavy_model_that_sorted_greedy_cannot(world, world_size):
    greedy = world(rp.embedding_heavy, world_size, None)
    flat = world(rp.embedding_heavy, world_size, Flat())
    print(f"W={world_size} imbalance: sorted_greedy {greedy[0]['imbalance']:.3f}, flat {flat[0]['imbalance']:.4f}")
    assert greedy[0]["imbalance"] > 1.3
    assert flat[0]["imbalance"] <= 1.01
    for row in greedy + flat:
        assert row["max_diff"] <= 1e-6
    flat_bytes = [row["state_bytes"] for row in flat]
    assert max(flat_bytes) <= min(flat_bytes) + 16  # one element of each Adam moment at most


CLIP_CASES = {
    "sorted-2norm": rp.Case(clip=0.01),
    "sorted-inf": rp.Case(clip=0.01, norm_type=INF),
    "flat-2norm-groups": rp.Case(clip=0.01, partitioner=Flat(), layout="groups"),
    "flat-inf": rp.Case(clip=0.01, norm_type=INF, partitioner=Flat()),
    "bucket-view-sgd": rp.Case(clip=0.05, bucket_view=True, optimizer="sgd"),
    "flat-sgd-w3": rp.Case(clip=0.05, partitioner=Flat(), optimizer="sgd"),
}


@pytest.fixture(scope="module")
def clip_results(world):
    """Every case at W=2 in one world; the last one again at W=3."""
    names = list(CLIP_CASES)
    by_name: dict[str, list] = {name: [] for name in names}
    for rank_rows in world(rp.parity, 2, list(CLIP_CASES.values())):
        for name, row in zip(names, rank_rows):
            by_name[name].append(row)
    for (row,) in world(rp.parity, 3, [CLIP_CASES[names[-1]]]):
        by_name[names[-1]].append(row)
    return by_name


@pytest.mark.parametrize("name", list(CLIP_CASES))
def test_sharded_clipping_equals_clip_grad_norm_on_the_full_model(clip_results, name):
    for row in clip_results[name]:
        assert row["zero_norms"] == pytest.approx(row["ref_norms"], rel=1e-5)
        assert max(row["ref_norms"]) > CLIP_CASES[name].clip  # clipping really happened
        assert row["max_diff"] <= 1e-6


@pytest.mark.parametrize("partitioner", [None, Flat()], ids=["sorted_greedy", "flat"])
def test_bf16_with_fp32_master_shards_tracks_fp32(world, partitioner):
    """Stated tolerance: updates within 10% of the fp32 run's, losses within 2%."""
    for row in world(rp.mixed_precision, 2, partitioner):
        assert row["drift_master"] <= 0.10
        assert row["drift_bf16"] >= 5 * row["drift_master"]  # what the masters buy
        losses = row["losses"]
        assert losses["bf16-master"] == pytest.approx(losses["fp32"], rel=0.02)
        assert row["state_dtypes"] == ["torch.float32"]
        assert row["master_bytes"] == 4 * row["owned_numel"]


def test_clipping_is_refused_with_overlap(single_rank_group):
    opt = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.randn(3))], torch.optim.Adam, overlap_with_ddp=True)
    with pytest.raises(RuntimeError, match="overlap=false"):
        opt.clip_grad_norm_(1.0)
