"""A job that exits right after ``step()`` leaves no thread of zero_lab's alive (issue 37).

A daemon thread alive when the interpreter finalizes dies of ``pthread_exit`` the moment it wants
the GIL back; inside one of torch's GIL-releasing destructors (a ``Work``, a process group, a store)
that is ``std::terminate`` — "terminate called without an active exception", SIGABRT, after all the
work was done (:mod:`zero_lab.background`). So for every strategy and exchange collective, ten
times in a row in one world, each rank builds the optimizer, takes one step and runs what the
interpreter runs at exit (``atexit``): every thread zero_lab started (the shard-state server of each
ZeRO optimizer, the gradient-reduction worker) must be gone — joined, not just asked to stop —
before finalization could begin; and the threads exist before that, so the test sees them end.

Forkserver ranks end with ``os._exit`` (no finalization, so no abort to wait for): the test checks
the precondition directly, which fails every time rather than once in ten runs. Adding a strategy
is one entry in :data:`STRATEGIES`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import batch, loss_of, make_model
from zero_lab import Flat, ZeroRedundancyOptimizer, background, reduce_gradients
from zero_lab.engine import ShardedDataParallel
from zero_lab.overlap import hook_with_zero_step, prefetch_exchange

RUNS = 10


Built = tuple[torch.nn.Module, torch.optim.Optimizer]  # what the loop calls, what steps


def _zero(model: torch.nn.Module, **kwargs: Any) -> Built:
    ddp = DDP(model)
    return ddp, ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, lr=1e-2, **kwargs)


def _overlap(model: torch.nn.Module) -> Built:
    ddp, opt = _zero(model, overlap_with_ddp=True)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, opt))
    return ddp, opt


def _grad_reduce(model: torch.nn.Module) -> Built:
    ddp, opt = _zero(model, exchange="broadcast")
    reduce_gradients(ddp, opt, "reduce_scatter")
    return ddp, opt


def _grad_reduce_shm(model: torch.nn.Module) -> Built:
    ddp, opt = _zero(model, exchange="shm_all_gather")
    reduce_gradients(ddp, opt, "shm_reduce_scatter")
    return ddp, opt


def _prefetch(model: torch.nn.Module) -> Built:
    ddp, opt = _zero(model, exchange="p2p_all_gather")
    prefetch_exchange(model, opt)  # the exit comes with the last step's exchange in flight
    return ddp, opt


def _engine(model: torch.nn.Module, **kwargs: Any) -> Built:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return ShardedDataParallel(model, opt, partitioner=Flat(), prefetch=True, **kwargs), opt


#: name -> wrap a fresh model: (the module the loop calls, the optimizer that steps). A new engine or
#: strategy is one more entry.
STRATEGIES: dict[str, Callable[[torch.nn.Module], Built]] = {
    "ddp-adam": lambda model: (ddp := DDP(model), torch.optim.Adam(ddp.parameters(), lr=1e-2)),
    "sorted_greedy-broadcast": lambda model: _zero(model, exchange="broadcast"),
    "sorted_greedy-all_gather": lambda model: _zero(model, exchange="all_gather"),
    "sorted_greedy-p2p_all_gather": lambda model: _zero(model, exchange="p2p_all_gather"),
    "flat-broadcast": lambda model: _zero(model, partitioner=Flat(), exchange="broadcast"),
    "flat-bucket_view-all_gather": lambda model: _zero(
        model, partitioner=Flat(), parameters_as_bucket_view=True, exchange="all_gather"
    ),
    "overlap": _overlap,
    "grad_reduce=reduce_scatter": _grad_reduce,
    "prefetch-p2p_all_gather": _prefetch,
    "engine-flat-prefetch": _engine,
    "grad_reduce=shm_reduce_scatter-shm_all_gather": _grad_reduce_shm,
    "engine-shm": lambda model: _engine(model, grad_reduce="shm_reduce_scatter", exchange="shm_all_gather"),
}


def _ours() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("zero_lab-"))


def _land_in_flight(wrapped: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Finish what the last step left in flight (a prefetched exchange or gather)."""
    if isinstance(opt, ZeroRedundancyOptimizer):
        opt.wait_for_exchange()
    if isinstance(wrapped, ShardedDataParallel):
        wrapped.close()


def exit_after_step(name: str, runs: int) -> dict[str, list[list[str]]]:
    """``runs`` times: a fresh model and optimizer, one step, then what ``atexit`` runs; zero_lab's
    threads before and after that."""
    before, after = [], []
    for run in range(runs):
        wrapped, opt = STRATEGIES[name](make_model(seed=run))
        loss_of(wrapped, batch(run, dist.get_rank())).backward()
        opt.step()
        before.append(_ours())
        background.end_all()  # what the interpreter's exit runs (atexit), before it finalizes
        after.append(_ours())
        _land_in_flight(wrapped, opt)  # before the next run's collectives
        del wrapped, opt
    return {"before": before, "after": after}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_no_thread_of_zero_labs_outlives_the_exit_right_after_step(world, name):
    for rank, seen in enumerate(world(exit_after_step, 2, name, RUNS)):
        assert seen["after"] == [[]] * RUNS, (rank, seen["after"])
        if name.startswith(("sorted_greedy", "flat", "overlap", "grad_reduce", "prefetch")):  # ZeRO optimizers
            # each serves its shard states from its first step
            assert all(f"zero_lab-state-{rank}" in names for names in seen["before"]), (rank, seen["before"])
        if name.startswith("grad_reduce"):
            assert all("zero_lab-grad-reduce" in names for names in seen["before"]), (rank, seen["before"])
