"""Partitioners are pure functions of sizes: tested here at simulated scale, no processes."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from zero_lab.partition import (
    DdpBucket,
    Flat,
    Manual,
    ParamSpec,
    Partition,
    Shard,
    SortedGreedy,
)


def specs_of(sizes, groups=None, names=None, trainable=None):
    groups = groups or [0] * len(sizes)
    names = names or [None] * len(sizes)
    trainable = trainable or [True] * len(sizes)
    return [ParamSpec(numel=n, group=g, name=m, trainable=t) for n, g, m, t in zip(sizes, groups, names, trainable)]


def naive_greedy(sizes, groups, world_size):
    """torch's algorithm, written the straightforward O(n·W) way (the oracle)."""
    loads, owners = [0] * world_size, [0] * len(sizes)
    for group in sorted(set(groups)):
        members = [i for i in range(len(sizes)) if groups[i] == group]
        for i in sorted(members, key=lambda i: sizes[i], reverse=True):
            rank = loads.index(min(loads))
            owners[i] = rank
            loads[rank] += sizes[i]
    return owners


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 64])
def test_sorted_greedy_matches_the_straightforward_algorithm(world_size):
    rng = random.Random(world_size)
    sizes = [rng.choice([1, 7, 64, 64, 4096, 65536, rng.randint(1, 10**6)]) for _ in range(500)]
    groups = sorted(rng.randint(0, 2) for _ in sizes)
    partition = SortedGreedy()(specs_of(sizes, groups), world_size)
    assert partition.owners() == naive_greedy(sizes, groups, world_size)


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_sorted_greedy_agrees_with_torch_zero_owners(single_rank_group, world_size):
    """torch's own class, asked to partition for a simulated world size."""
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(300, 16), nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 10))
    groups = [
        {"params": [p for n, p in model.named_parameters() if "weight" in n]},
        {"params": [p for n, p in model.named_parameters() if "bias" in n], "weight_decay": 0.0},
    ]
    torch_zero = TorchZero(groups, torch.optim.Adam, lr=1e-3)
    torch_zero.world_size = world_size
    torch_zero._clear_cache()
    torch_owner = torch_zero._param_to_rank
    params = [p for g in torch_zero.param_groups for p in g["params"]]
    specs = [ParamSpec(numel=p.numel(), group=gi) for gi, g in enumerate(torch_zero.param_groups) for p in g["params"]]
    assert SortedGreedy()(specs, world_size).owners() == [torch_owner[p] for p in params]


def test_sorted_greedy_is_deterministic_and_balanced():
    rng = random.Random(0)
    sizes = [rng.randint(1, 10_000) for _ in range(2_000)]
    first = SortedGreedy()(specs_of(sizes), 16)
    assert first == SortedGreedy()(specs_of(sizes), 16)
    assert first.report().imbalance < 1.01  # many small params: greedy packs tightly


def test_sorted_greedy_100k_params_at_1024_ranks():
    rng = random.Random(1)
    sizes = [rng.choice([768, 768 * 768, 3072 * 768, 50257 * 768 // 64]) for _ in range(100_000)]
    partition = SortedGreedy()(specs_of(sizes), 1024)
    report = partition.report()
    assert len(report.numel_per_rank) == 1024
    assert sum(report.numel_per_rank) == sum(sizes)
    assert report.imbalance < 1.05


def test_report_counts_bytes_and_imbalance():
    specs = [ParamSpec(numel=6, itemsize=2), ParamSpec(numel=2, itemsize=2)]
    report = SortedGreedy()(specs, 2).report()
    assert report.numel_per_rank == (6, 2)
    assert report.bytes_per_rank == (12, 4)
    assert report.imbalance == pytest.approx(6 / 4)
    assert "imbalance" in str(report) and report.as_dict()["imbalance"] == pytest.approx(1.5)


def test_partition_rejects_shards_that_do_not_tile():
    specs = (ParamSpec(numel=4),)
    with pytest.raises(ValueError, match="do not tile"):
        Partition(specs, 2, (Shard(0, 0, 0, 2), Shard(0, 1, 1, 4)))
    with pytest.raises(ValueError, match="covered up to 2"):
        Partition(specs, 2, (Shard(0, 0, 0, 2),))


# ---------------------------------------------------------------- manual
NAMES = ["encoder.0.weight", "encoder.0.bias", "decoder.0.weight", "decoder.0.bias", "head.weight"]


def test_manual_globs_and_regex():
    specs = specs_of([10, 2, 10, 2, 5], names=NAMES)
    partition = Manual([["encoder.*", "head.*"], ["re:decoder\\.\\d+\\..*"]])(specs, 2)
    assert partition.owners() == [0, 0, 1, 1, 0]


def test_manual_from_tensors():
    tensors = [torch.zeros(n) for n in (3, 4, 5)]
    specs = [ParamSpec(numel=t.numel(), key=id(t)) for t in tensors]
    assert Manual([[tensors[2]], [tensors[0], tensors[1]]])(specs, 2).owners() == [1, 1, 0]


@pytest.mark.parametrize(
    ("params_per_rank", "message"),
    [
        ([["encoder.*"]], "has 1 entries but world_size is 2"),
        ([["encoder.*", "head.*"], ["decoder.*", "nope.*"]], "'nope.\\*' matches no parameter"),
        ([["encoder.*", "head.*"], ["decoder.*", "encoder.0.bias"]], "rank 0 and rank 1"),
        ([["encoder.*"], ["decoder.*"]], "without an owner: 'head.weight'"),
    ],
)
def test_manual_validation_names_the_problem(params_per_rank, message):
    specs = specs_of([10, 2, 10, 2, 5], names=NAMES)
    with pytest.raises(ValueError, match=message):
        Manual(params_per_rank)(specs, 2)


def test_manual_needs_names_for_patterns_and_known_tensors():
    with pytest.raises(ValueError, match="named_parameters"):
        Manual([["encoder.*"], []])(specs_of([3, 3]), 2)
    stranger = torch.zeros(3)
    with pytest.raises(ValueError, match="not passed to the optimizer"):
        Manual([[stranger], []])(specs_of([3]), 2)


def test_manual_places_unlisted_frozen_params_on_least_loaded_rank():
    specs = specs_of([10, 2, 10, 2, 5], names=NAMES, trainable=[True, True, True, True, False])
    partition = Manual([["encoder.*"], ["decoder.*"]])(specs, 2)
    assert partition.owners()[4] in (0, 1)


# ---------------------------------------------------------------- flat
@pytest.mark.parametrize(
    ("sizes", "world_size"),
    [([1], 4), ([3, 1], 8), ([10, 7, 3, 3, 1], 3), ([5, 5], 2), ([1000, 1, 1], 7), ([2**20 + 3], 64)],
)
def test_flat_tiles_every_param_and_balances_exactly(sizes, world_size):
    partition = Flat()(specs_of(sizes), world_size)  # Partition() itself checks the tiling
    report = partition.report()
    chunk = -(-sum(sizes) // world_size)
    assert max(report.numel_per_rank) <= chunk
    assert report.imbalance <= 1 + world_size / sum(sizes)
    (layout,) = partition.layouts
    assert layout.numel == chunk * world_size
    assert layout.bounds == tuple((r * chunk, (r + 1) * chunk) for r in range(world_size))  # equal, rank-major


def test_flat_lays_out_per_group_and_kind():
    specs = [
        ParamSpec(numel=5, group=0),
        ParamSpec(numel=5, group=1),
        ParamSpec(numel=5, group=0, kind="cpu/bfloat16", itemsize=2),
    ]
    partition = Flat()(specs, 2)
    assert [(lay.group, lay.kind, lay.params) for lay in partition.layouts] == [
        (0, "cpu/float32", (0,)),
        (1, "cpu/float32", (1,)),
        (0, "cpu/bfloat16", (2,)),
    ]


def test_flat_bucket_cap_cuts_buffers_at_parameter_boundaries_in_order():
    sizes = [100, 100, 300, 50, 50, 50, 10]  # float32: 400, 400, 1200, 200, ... bytes
    cap_mb = 800 / 2**20  # 800 bytes
    partition = Flat(bucket_cap_mb=cap_mb)(specs_of(sizes), 3)
    # closed before the parameter that would pass 800 bytes; the 1200-byte one alone
    assert [lay.params for lay in partition.layouts] == [(0, 1), (2,), (3, 4, 5, 6)]
    for layout in partition.layouts:
        total = sum(sizes[i] for i in layout.params)
        chunk = -(-total // 3)
        assert layout.numel == 3 * chunk
        assert layout.bounds == ((0, chunk), (chunk, 2 * chunk), (2 * chunk, 3 * chunk))  # equal, rank-major
        assert list(layout.offsets) == [sum(sizes[i] for i in layout.params[:k]) for k in range(len(layout.params))]
    # every rank within one element per buffer of total / W
    assert max(partition.report().numel_per_rank) - sum(sizes) / 3 <= len(partition.layouts)
    assert Flat(bucket_cap_mb=1e6)(specs_of(sizes), 3).layouts == Flat()(specs_of(sizes), 3).layouts
    assert repr(Flat(bucket_cap_mb=25.0)) == "Flat(bucket_cap_mb=25.0)"


def test_flat_bucket_cap_keeps_a_modules_parameters_together():
    names = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias", "scale"]
    sizes = [200, 10, 200, 10, 50, 10, 1]
    partition = Flat(bucket_cap_mb=400 / 2**20)(specs_of(sizes, names=names), 2)  # 400 bytes < one layer
    # each layer alone (larger than the cap, never split); the small last layer shares with `scale`
    assert [lay.params for lay in partition.layouts] == [(0, 1), (2, 3), (4, 5, 6)]


@pytest.mark.parametrize("cap", [0, -1.0])
def test_flat_bucket_cap_must_be_positive(cap):
    with pytest.raises(ValueError, match=r"bucket_cap_mb=.* must be a positive number of MiB"):
        Flat(bucket_cap_mb=cap)


def test_flat_beats_sorted_greedy_on_an_embedding_heavy_model():
    sizes = [50_000 * 64] + [64 * 64] * 8 + [64] * 8
    greedy = SortedGreedy()(specs_of(sizes), 4).report().imbalance
    flat = Flat()(specs_of(sizes), 4).report().imbalance
    assert greedy > 3.0 and flat <= 1.0001


def test_world_size_must_be_positive():
    with pytest.raises(ValueError, match="world_size"):
        SortedGreedy()(specs_of([1]), 0)


# ---------------------------------------------------------------- ddp buckets
def bucketed_specs(buckets_sizes):
    return [ParamSpec(numel=n, bucket=b) for b, sizes in enumerate(buckets_sizes) for n in sizes]


def test_ddp_bucket_gives_each_bucket_to_one_rank():
    specs = bucketed_specs([[10, 10], [5, 5, 5], [20], [1]])
    # Buckets in index order to the least-loaded rank: b0 (20) -> r0; b1 (15) -> r1;
    # b2 (20) -> r1 (15 < 20); b3 (1) -> r0 (20 < 35).
    partition = DdpBucket()(specs, 2)
    assert partition.owners() == [0, 0, 1, 1, 1, 1, 0]
    assert partition.report().numel_per_rank == (21, 35)


def test_ddp_bucket_sharded_splits_every_bucket_toward_an_even_share():
    specs = bucketed_specs([[8] * 8, [8] * 8])
    partition = DdpBucket(shard_buckets=True)(specs, 4)
    for bucket in (0, 1):
        owners = {partition.owners()[i] for i, s in enumerate(specs) if s.bucket == bucket}
        assert owners == {0, 1, 2, 3}
    assert partition.report().imbalance == pytest.approx(1.0)


def test_ddp_bucket_places_unbucketed_params_too():
    specs = [*bucketed_specs([[10, 10]]), ParamSpec(numel=7, trainable=False)]
    partition = DdpBucket()(specs, 2)
    assert partition.owners()[2] == 1  # the least-loaded rank
