"""One model of DDP's gradient buckets: caps from DDP itself or from ``bucket_cap_mb``, and the
overlap optimizer built once along it (in-process one-rank group).

The optimizer with ``overlap_with_ddp=True`` builds its partition exactly once, at construction:
along ``ddp_buckets=``, or DDP's default caps modelled over the parameters (torch's drop-in
order); a hook that brings other buckets keeps it and a warning names the constructor argument;
``exchange="all_gather"`` is refused under overlap, ``auto`` reports broadcast.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.ddp_buckets import DdpBuckets, ddp_bucket_map
from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved
from zero_lab.partition import DdpBucket, ParamSpec, Partition

MIB = 2**20


def test_assign_closes_buckets_at_the_caps_and_numbers_last_layers_first():
    assert DdpBuckets(bucket_cap_bytes=12, first_bucket_cap_bytes=8).assign([4] * 7) == [2, 2, 1, 1, 1, 0, 0]
    assert DdpBuckets(bucket_cap_bytes=8, first_bucket_cap_bytes=100).assign([4] * 4) == [1, 1, 0, 0]  # min(first, cap)
    assert DdpBuckets().assign([100]) == [0]
    assert (DdpBuckets().bucket_cap_bytes, DdpBuckets().first_bucket_cap_bytes) == (25 * MIB, MIB)
    assert DdpBuckets(bucket_cap_bytes=12, first_bucket_cap_bytes=8).assign([100]) == [0]  # too big: a bucket alone
    with pytest.raises(ValueError, match="bucket_cap_bytes must be a non-negative int"):
        DdpBuckets(bucket_cap_bytes=-1)


@pytest.mark.parametrize("bucket_cap_mb", [None, 0.001, 25])
def test_the_config_model_is_what_ddp_takes(single_rank_group, bucket_cap_mb):
    ddp = DDP(nn.Linear(4, 4)) if bucket_cap_mb is None else DDP(nn.Linear(4, 4), bucket_cap_mb=bucket_cap_mb)
    assert DdpBuckets.from_bucket_cap_mb(bucket_cap_mb) == DdpBuckets.from_ddp(ddp)


def test_the_bucket_map_skips_frozen_parameters(single_rank_group):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[0].bias.requires_grad_(False)
    ddp = DDP(model, bucket_cap_mb=300 / MIB)  # weights 256 bytes, bias 32: a new bucket at every weight
    buckets = ddp_bucket_map(ddp)
    assert buckets == {id(model[0].weight): 1, id(model[1].weight): 0, id(model[1].bias): 0}


class CountingDdpBucket(DdpBucket):
    """``DdpBucket`` that counts its calls and keeps the buckets it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int | None]] = []

    def __call__(self, specs: Sequence[ParamSpec], world_size: int) -> Partition:
        self.calls.append([s.bucket for s in specs])
        return super().__call__(specs, world_size)


def _overlapped() -> tuple[nn.Module, DDP]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    return model, DDP(model, bucket_cap_mb=0.0001)  # 104-byte cap: two buckets


def _train(ddp: DDP, opt: ZeroRedundancyOptimizer, steps: int = 2) -> None:
    for step in range(steps):
        opt.zero_grad()
        ddp(torch.randn(4, 6, generator=torch.Generator().manual_seed(step))).pow(2).sum().backward()
        opt.step()


@pytest.mark.parametrize("hook", [hook_with_zero_step, hook_with_zero_step_interleaved])
def test_torch_order_builds_the_partition_once_at_construction_along_ddps_default_buckets(single_rank_group, hook):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    ddp = DDP(model)  # DDP's default caps: what the optimizer models when given no ddp_buckets
    partitioner = CountingDdpBucket()
    opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, overlap_with_ddp=True, partitioner=partitioner)
    buckets = ddp_bucket_map(ddp)
    assert partitioner.calls == [[buckets[id(p)] for p in model.parameters()]]  # built now, along DDP's buckets
    assert opt.exchange_report().mode != "overlap_per_bucket"  # no hook attached yet
    ddp.register_comm_hook(None, hook(allreduce_hook, ddp, opt))
    _train(ddp, opt)
    assert len(partitioner.calls) == 1  # never rebuilt
    assert opt.exchange_report().mode == "overlap_per_bucket"
    assert opt.pipeline.exchange_timing == "per_bucket"


def test_buckets_given_at_construction_build_once_and_the_hook_keeps_them(single_rank_group, caplog):
    model, ddp = _overlapped()
    partitioner = CountingDdpBucket()
    opt = ZeroRedundancyOptimizer(
        model.parameters(),
        torch.optim.Adam,
        overlap_with_ddp=True,
        partitioner=partitioner,
        ddp_buckets=ddp_bucket_map(ddp),
    )
    assert len(partitioner.calls) == 1
    with caplog.at_level(logging.WARNING, logger="zero_lab.pipeline"):
        ddp.register_comm_hook(None, hook_with_zero_step_interleaved(allreduce_hook, ddp, opt))
    assert caplog.records == []  # the hook brings the same buckets
    _train(ddp, opt)
    assert len(partitioner.calls) == 1


def test_shards_built_without_ddps_buckets_are_kept_with_a_warning_naming_the_argument(single_rank_group, caplog):
    model, ddp = _overlapped()
    partitioner = CountingDdpBucket()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, partitioner=partitioner)
    assert len(partitioner.calls) == 1  # built at construction, along DDP's default caps (modelled)
    partition = opt.partition
    with caplog.at_level(logging.WARNING, logger="zero_lab.pipeline"):
        ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, opt, shard_buckets=True))
    assert len(partitioner.calls) == 1 and opt.partition is partition  # not rebuilt
    (record,) = caplog.records
    assert "ddp_buckets=zero_lab.ddp_buckets.ddp_bucket_map(ddp)" in record.getMessage()
    assert "partitioner=DdpBucket(shard_buckets=True)" in record.getMessage()
    reference = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    reference.load_state_dict(model.state_dict())
    plain = torch.optim.Adam(reference.parameters())
    _train(ddp, opt)
    _train(reference, plain)  # still correct: each bucket is planned from its own parameters
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


def test_all_gather_is_refused_under_overlap_and_auto_reports_broadcast(single_rank_group):
    model, ddp = _overlapped()
    with pytest.raises(ValueError, match=r"exchange='all_gather' with overlap_with_ddp=True.*'broadcast' or 'auto'"):
        ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, exchange="all_gather")
    with pytest.raises(ValueError, match=r"exchange='ring' is not one of"):  # refused before anything is built
        ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, exchange="ring")
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, exchange="auto")
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, opt))
    report = opt.exchange_report()
    assert (report.mode, report.layout, report.collective, report.requested) == (
        "overlap_per_bucket",
        "overlap",
        "broadcast",
        "auto",
    )
