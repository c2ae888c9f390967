"""The step model's bytes (zero_lab.step_model.communicator_bytes) equal what zero_lab's Communicators
count on every rank of real Gloo worlds (W = 2, 3): the exchange in each layout and collective, and the
gradient reduction by DDP's all-reduce (metered through the hook) and by the point-to-point reduce-scatter;
and at W = 4 as 2 × 2 (shard_size=2), where the reduce-scatter's owners then all-reduce across the pairs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.grad_reduce import reduce_gradients
from zero_lab.partition import Flat, SortedGreedy
from zero_lab.planner import specs_from_module
from zero_lab.step_model import ModeledStrategy, communicator_bytes

# name -> the modelled strategy (what the run below does)
CASES: dict[str, ModeledStrategy] = {
    "flat_broadcast": ModeledStrategy("flat_broadcast", "", Flat, exchange="broadcast"),
    "flat_all_gather": ModeledStrategy("flat_all_gather", "", Flat, exchange="all_gather"),
    "greedy_view_all_gather": ModeledStrategy("greedy_view_all_gather", "", SortedGreedy, exchange="all_gather"),
    "greedy_view_broadcast": ModeledStrategy("greedy_view_broadcast", "", SortedGreedy, exchange="broadcast"),
    "greedy_per_shard_broadcast": ModeledStrategy(
        "greedy_per_shard_broadcast", "", SortedGreedy, exchange="broadcast", bucket_view=False
    ),
    "flat_reduce_scatter": ModeledStrategy(
        "flat_reduce_scatter", "", Flat, grad_reduce="reduce_scatter", exchange="broadcast"
    ),
    "greedy_all_reduce_hook": ModeledStrategy("greedy_all_reduce_hook", "", SortedGreedy, exchange="broadcast"),
}


def model() -> nn.Module:
    """Uneven layers: partitions over 2 and 3 ranks are unequal and flat cuts parameters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 40), nn.Tanh(), nn.Linear(40, 24), nn.Tanh(), nn.Linear(24, 7))


def counted_rank() -> dict[str, dict[str, tuple[int, int]]]:
    """Per case, on this rank: ``{phase: (bytes, sent_bytes)}`` the Communicators counted in the second step."""
    template = model()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    out = {}
    for name, strategy in CASES.items():
        ddp = DDP(copy.deepcopy(template))
        zero = ZeroRedundancyOptimizer(
            ddp.parameters(),
            torch.optim.Adam,
            partitioner=strategy.partitioner(),
            parameters_as_bucket_view=strategy.bucket_view,
            exchange=strategy.exchange,
            lr=1e-3,
        )
        hooked = name.endswith(("_reduce_scatter", "_hook"))
        handle = reduce_gradients(ddp, zero, strategy.grad_reduce) if hooked else None
        for _ in range(2):
            exchange = zero.comm_stats.snapshot()
            grads = handle.stats.snapshot() if handle else None
            zero.zero_grad()
            ddp(x).pow(2).mean().backward()
            zero.step()
        moved = zero.comm_stats.since(exchange)
        reduced = handle.stats.since(grads) if handle else None
        out[name] = {
            "exchange": (moved.bytes, moved.sent_bytes),
            "grad_reduce": (reduced.bytes, reduced.sent_bytes) if reduced else None,
        }
        if handle:
            handle.close()
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_predicted_bytes_are_the_communicators_counts(world, world_size: int) -> None:
    ranks: list[Any] = world(counted_rank, world_size)
    specs = specs_from_module(model())
    for rank, counted in enumerate(ranks):
        for name, strategy in CASES.items():
            predicted = communicator_bytes(specs, strategy, world_size, rank)
            assert counted[name]["exchange"] == predicted["exchange"], (name, rank)
            if counted[name]["grad_reduce"] is not None:
                assert counted[name]["grad_reduce"] == predicted["grad_reduce"], (name, rank)
    # the cases differ where they should: padding to the fullest owner, one broadcast per owner's range
    rank0 = {name: ranks[0][name]["exchange"][0] for name in CASES}
    assert rank0["greedy_view_all_gather"] > rank0["greedy_view_broadcast"] == sum(s.nbytes for s in specs)


def counted_hierarchical() -> dict[str, tuple[int, int]]:
    """W=4 as 2 × 2 (``shard_size=2``): flat, bucket view, p2p reduce-scatter inside the pair, each owner's
    half all-reduced across the pairs, broadcast inside the pair; what the Communicators counted in step 2."""
    ddp = DDP(model())
    zero = ZeroRedundancyOptimizer(
        ddp.parameters(), torch.optim.Adam, partitioner=Flat(), exchange="broadcast", shard_size=2, lr=1e-3
    )
    handle = reduce_gradients(ddp, zero, "reduce_scatter")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    for _ in range(2):
        exchange, grads = zero.comm_stats.snapshot(), handle.stats.snapshot()
        zero.zero_grad()
        ddp(x).pow(2).mean().backward()
        zero.step()
    moved, reduced = zero.comm_stats.since(exchange), handle.stats.since(grads)
    handle.close()
    return {"exchange": (moved.bytes, moved.sent_bytes), "grad_reduce": (reduced.bytes, reduced.sent_bytes)}


def test_hierarchical_bytes_are_the_communicators_counts(world) -> None:
    ranks: list[Any] = world(counted_hierarchical, 4)
    specs = specs_from_module(model())
    strategy = CASES["flat_reduce_scatter"]
    for rank, counted in enumerate(ranks):
        assert counted == communicator_bytes(specs, strategy, 4, rank, shard_size=2), rank
    # the replica all-reduce is counted: more gradient bytes than the pair's point to point alone
    assert ranks[0]["grad_reduce"][0] > sum(s.nbytes for s in specs)
