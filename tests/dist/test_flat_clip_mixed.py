"""Element-granular flat partitions, sharded gradient clipping and fp32 master shards (Gloo)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import Case, batch, loss_of, make_model, max_diff, parity, zero_or_plain
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import Flat, Partitioner

INF = float("inf")


@pytest.mark.parametrize("world_size", [2, 3])
def test_flat_balances_an_embedding_heavy_model_that_sorted_greedy_cannot(world, world_size):
    greedy = world(embedding_heavy, world_size, None)
    flat = world(embedding_heavy, world_size, Flat())
    print(f"W={world_size} imbalance: sorted_greedy {greedy[0]['imbalance']:.3f}, flat {flat[0]['imbalance']:.4f}")
    assert greedy[0]["imbalance"] > 1.3
    assert flat[0]["imbalance"] <= 1.01
    for row in greedy + flat:
        assert row["max_diff"] <= 1e-6
    flat_bytes = [row["state_bytes"] for row in flat]
    assert max(flat_bytes) <= min(flat_bytes) + 16  # one element of each Adam moment at most


CLIP_CASES = {
    "sorted-2norm": Case(clip=0.01),
    "sorted-inf": Case(clip=0.01, norm_type=INF),
    "flat-2norm-groups": Case(clip=0.01, partitioner=Flat(), layout="groups"),
    "flat-inf": Case(clip=0.01, norm_type=INF, partitioner=Flat()),
    "bucket-view-sgd": Case(clip=0.05, bucket_view=True, optimizer="sgd"),
    "flat-sgd-w3": Case(clip=0.05, partitioner=Flat(), optimizer="sgd"),
}


@pytest.fixture(scope="module")
def clip_results(world):
    """Every case at W=2 in one world; the last one again at W=3."""
    names = list(CLIP_CASES)
    by_name: dict[str, list] = {name: [] for name in names}
    for rank_rows in world(parity, 2, list(CLIP_CASES.values())):
        for name, row in zip(names, rank_rows):
            by_name[name].append(row)
    for (row,) in world(parity, 3, [CLIP_CASES[names[-1]]]):
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
    for row in world(mixed_precision, 2, partitioner):
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


# ---------------------------------------------------------------- rank programs
class EmbeddingHeavy(nn.Module):
    """An LM-like model whose embedding is most of the parameters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(1000, 32)
        self.mix = nn.Linear(32, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens).mean(dim=1))))


def embedding_heavy(partitioner: Partitioner | None, steps: int = 10) -> dict[str, Any]:
    """Imbalance, per-rank state bytes and DDP parity on an embedding-heavy model."""
    rank = dist.get_rank()
    models = {}
    for mode in ("zero", "plain"):
        model = EmbeddingHeavy()
        ddp = DDP(model)
        opt = zero_or_plain(mode, model.parameters(), partitioner=partitioner, lr=1e-2)
        if mode == "zero":
            zero_opt = opt
        for step in range(steps):
            g = torch.Generator().manual_seed(1000 * step + rank)
            tokens = torch.randint(0, 1000, (8, 5), generator=g)
            opt.zero_grad()
            ddp(tokens).pow(2).mean().backward()
            opt.step()
        models[mode] = model
    return {
        "imbalance": zero_opt.partition.report().imbalance,
        "state_bytes": optimizer_state_bytes(zero_opt),
        "max_diff": max_diff(models["zero"].parameters(), models["plain"].parameters()),
    }


def mixed_precision(partitioner: Partitioner | None, steps: int = 30, lr: float = 1e-3) -> dict[str, Any]:
    """bf16 parameters with and without fp32 master shards, against an fp32 DDP + Adam run.

    Compares *updates* (final - initial parameters), relative to the fp32 run's largest
    update, so the rounding of the initial weights to bf16 does not count as drift.
    """
    rank = dist.get_rank()
    final, start, losses = {}, {}, {}
    extra = {}
    for mode in ("fp32", "bf16-master", "bf16"):
        model = make_model()
        if mode != "fp32":
            model = model.to(torch.bfloat16)
        ddp = DDP(model)
        start[mode] = [p.detach().float().clone() for p in model.parameters()]
        losses[mode] = []
        if mode == "fp32":
            opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            opt = ZeroRedundancyOptimizer(
                model.parameters(),
                torch.optim.Adam,
                partitioner=partitioner,
                master_weights=mode == "bf16-master",
                lr=lr,
            )
        for step in range(steps):
            x = batch(step, rank).to(next(model.parameters()).dtype)
            opt.zero_grad()
            loss = loss_of(ddp, x)
            loss.backward()
            opt.step()
            losses[mode].append(loss.item())
        final[mode] = [p.detach().float().clone() for p in model.parameters()]
        if mode == "bf16-master":
            extra = {
                "master_bytes": opt.master_weight_bytes(),
                "state_dtypes": sorted({str(v.dtype) for s in opt.optim.state.values() for v in s.values() if v.dim()}),
                "owned_numel": sum(s.numel for s in opt.partition.shards_of(rank)),
            }

    def update(mode: str) -> list[torch.Tensor]:
        return [a - b for a, b in zip(final[mode], start[mode])]

    reference = update("fp32")
    scale = max(u.abs().max().item() for u in reference)

    def drift(mode: str) -> float:
        return max_diff(update(mode), reference) / scale

    return {
        "drift_master": drift("bf16-master"),
        "drift_bf16": drift("bf16"),
        "losses": losses,
        **extra,
    }
