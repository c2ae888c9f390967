"""zero_lab.bench.stepper: a deferred (prefetch) step gives the same training as the plain loop (one rank)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.bench.stepper import Runner
from zero_lab.bench.workloads import MODELS
from zero_lab.overlap import prefetch_exchange
from zero_lab.partition import Flat


def _plain(template: nn.Module) -> Runner:
    model = copy.deepcopy(template)
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Runner(model, model, adam, adam)


def _prefetch(template: nn.Module) -> tuple[Runner, ZeroRedundancyOptimizer]:
    model = copy.deepcopy(template)
    zero = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.Adam, parameters_as_bucket_view=True, partitioner=Flat(), lr=1e-2
    )
    handle = prefetch_exchange(model, zero)
    runner = Runner(
        model,
        model,
        zero,
        zero.optim,
        comm_stats=lambda: zero.comm_stats,
        step_deferred=True,
        settle=zero.wait_for_exchange,
        on_close=[handle.remove],
    )
    return runner, zero


def test_a_deferred_step_runs_at_the_next_iteration_and_finish_takes_the_last(single_rank_group) -> None:
    preset = MODELS["tiny"]
    torch.manual_seed(0)
    template = preset.build()
    plain, (deferred, zero) = _plain(template), _prefetch(template)
    records = []
    for step in range(4):
        x, y = preset.batch(step, 0)
        plain.iteration(x, y, F.mse_loss)
        records.append(deferred.iteration(x, y, F.mse_loss))
    # the first iteration has no gradients to step yet; every later one steps the previous gradients first
    assert records[0].local_s == 0.0 and all(r.local_s > 0 for r in records[1:])
    assert all(r.step_s >= r.local_s for r in records)
    assert any(not torch.equal(p, q) for p, q in zip(plain.model.parameters(), deferred.model.parameters()))
    deferred.finish()  # the fourth update
    for p, q in zip(plain.model.parameters(), deferred.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=0)
    assert {int(state["step"]) for state in zero.optim.state.values()} == {4}
    after = [p.clone() for p in deferred.model.parameters()]
    deferred.finish()  # nothing pending: no update
    assert all(torch.equal(p, q) for p, q in zip(after, deferred.model.parameters()))
    deferred.close()
    assert zero.pipeline.prefetching is False  # the prefetch hooks are gone
