"""Measured bytes: the core's optimizer-state counter and the benchmark's profiler-based collective meter."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.bench.meter import CollectiveMeter, _without_profiler_notes, kind_of
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
    assert optimizer_state_bytes(zero) == 2 * 37 * 4 + 2 * 4


def test_collectives_are_counted_by_kind_from_the_profiler(single_rank_group, capfd) -> None:
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
    assert "USDT" not in capfd.readouterr().err  # Kineto's profiler_start / profiler_stop lines, held back


def test_only_kinetos_lines_are_held_back(capfd) -> None:
    with _without_profiler_notes():
        os.write(2, b"USDT:2026-11-24 10065:10065 SyncActivityProfilerHandler.cpp:52] profiler_start\nkept\n")
    assert capfd.readouterr().err == "kept\n"
