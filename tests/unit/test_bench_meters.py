"""Measured bytes: the core's optimizer-state counter and the benchmark's profiler-based collective meter."""

from __future__ import annotations

import torch
import torch.distributed as dist

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.bench.meter import CollectiveMeter, kind_of
from zero_lab.measure import optimizer_state_bytes


def test_state_bytes_of_adam_after_one_step_and_through_a_wrapper(single_rank_group) -> None:
    params = [torch.nn.Parameter(torch.ones(10, 3)), torch.nn.Parameter(torch.ones(7))]
    adam = torch.optim.Adam(params, lr=0.1)
    assert optimizer_state_bytes(adam) == 0
    for p in params:
        p.grad = torch.ones_like(p)
    adam.step()
    assert optimizer_state_bytes(adam) == 2 * 37 * 4 + 2 * 4  # exp_avg + exp_avg_sq, one fp32 step each
    zero = ZeroRedundancyOptimizer(params, torch.optim.Adam, lr=0.1)
    zero.step()
    assert optimizer_state_bytes(zero) == zero.local_state_bytes() == 2 * 37 * 4 + 2 * 4


def test_collectives_are_counted_by_kind_from_the_profiler(single_rank_group) -> None:
    assert [kind_of(op) for op in ("broadcast", "all_gather", "allreduce", "reduce_scatter", "barrier")] == [
        "params",
        "params",
        "grads",
        "grads",
        None,
    ]
    with CollectiveMeter(element_size=4, world_size=1) as meter:
        dist.broadcast(torch.zeros(10), src=0)
        dist.all_reduce(torch.zeros(3))
        dist.barrier()
    totals = meter.totals()
    assert (totals["params"].calls, totals["params"].bytes) == (1, 40)
    assert (totals["grads"].calls, totals["grads"].bytes) == (1, 12)
