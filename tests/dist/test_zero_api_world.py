"""The drop-in contract on real worlds: local groups, add_param_group, one exchange per element."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import batch, loss_of, make_model, max_diff, zero_or_plain
from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab.partition import Partitioner


def test_every_global_group_has_a_local_group_even_if_empty(world):
    assert world(local_group_shapes, 2) == [[2, 0], [1, 1]]


def test_add_param_group_keeps_owners_and_matches_plain_adam(world):
    for row in world(add_group_mid_run, 2):
        assert row["max_diff"] <= 1e-6
        assert row["owners_after"][: len(row["owners_before"])] == row["owners_before"]
        assert row["local_groups"] == 2


@pytest.mark.parametrize(
    ("partitioner", "bucket_view", "exchange", "mode", "calls"),
    [
        (None, False, "broadcast", "per_shard_broadcast", "per_param"),
        (None, False, "all_gather", "per_shard_all_gather", 1),
        (None, True, "broadcast", "bucket_broadcast", 2),
        (None, True, "all_gather", "bucket_all_gather", 1),
        (Flat(), False, "broadcast", "flat_broadcast", 2),
        (Flat(), False, "all_gather", "flat_all_gather", 1),
        (None, False, "p2p_all_gather", "per_shard_p2p_all_gather", "per_param"),  # in place, one unit per shard
        (Flat(), True, "p2p_all_gather", "flat_p2p_all_gather", 1),
        (Flat(), True, "broadcast", "flat_broadcast", 2),
        (Flat(), True, "all_gather", "flat_all_gather", 1),
    ],
)
def test_each_element_is_exchanged_once_per_step(world, partitioner, bucket_view, exchange, mode, calls):
    for row in world(exchange_bytes, 2, partitioner, bucket_view, exchange):
        assert row["mode"] == mode
        assert row["calls"] == (row["num_params"] if calls == "per_param" else calls)
        if exchange == "all_gather" and partitioner is None:
            # unequal rank segments are padded to the longest for all_gather_into_tensor
            assert row["bytes"] == 2 * max(row["rank_bytes"])
        else:
            padding = 4 * 2  # flat pads the buffer to a multiple of W elements
            assert row["model_bytes"] <= row["bytes"] <= row["model_bytes"] + padding


# ---------------------------------------------------------------- rank programs
def add_group_mid_run(steps: int = 8, add_at: int = 3) -> dict[str, Any]:
    """Start with weights only, add the biases as a new group at ``add_at``; compare to plain Adam."""
    rank = dist.get_rank()
    models, owners_before, owners_after = {}, None, None
    for mode in ("zero", "plain"):
        model = make_model()
        ddp = DDP(model)
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
        opt = zero_or_plain(mode, weights, lr=1e-2)
        if mode == "zero":
            owners_before = opt.partition.owners()
        for step in range(steps):
            if step == add_at:
                opt.add_param_group({"params": biases, "lr": 3e-3})
            opt.zero_grad()
            loss_of(ddp, batch(step, rank)).backward()
            opt.step()
        if mode == "zero":
            owners_after = opt.partition.owners()
            local_groups = len(opt.optim.param_groups)
        models[mode] = model
    return {
        "max_diff": max_diff(models["zero"].parameters(), models["plain"].parameters()),
        "owners_before": owners_before,
        "owners_after": owners_after,
        "local_groups": local_groups,
    }


def local_group_shapes() -> list[int]:
    """Sizes of this rank's local groups when one global group is a single tiny tensor."""
    big = [torch.nn.Parameter(torch.randn(64)) for _ in range(3)]
    tiny = torch.nn.Parameter(torch.randn(1))
    opt = ZeroRedundancyOptimizer([{"params": big}, {"params": [tiny]}], torch.optim.Adam, lr=1e-3)
    return [len(group["params"]) for group in opt.optim.param_groups]


def exchange_bytes(partitioner: Partitioner | None, bucket_view: bool, exchange: str = "auto") -> dict[str, Any]:
    """Bytes and calls of one step's exchange, against the model's trainable bytes."""
    model = make_model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(
        model.parameters(),
        torch.optim.Adam,
        parameters_as_bucket_view=bucket_view,
        partitioner=partitioner,
        exchange=exchange,
        lr=1e-3,
    )
    loss_of(ddp, batch(0, dist.get_rank())).backward()
    before = opt.comm_stats.snapshot()
    opt.step()
    used = opt.comm_stats.since(before)
    return {
        "bytes": used.bytes,
        "calls": used.calls,
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "num_params": len(list(model.parameters())),
        "mode": opt.exchange_mode,
        "rank_bytes": list(opt.partition.report().bytes_per_rank),
    }
