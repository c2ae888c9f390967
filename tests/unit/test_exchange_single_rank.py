"""The exchange at world size 1 (in-process Gloo group): no collectives (the overlap hooks send
nothing either), prefetch is a no-op, the optimizer matches plain Adam bitwise; bad ``exchange=``
and swapping the partitioner are refused; :class:`FirstUse` orders units by first use."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import Flat, SortedGreedy, ZeroRedundancyOptimizer
from zero_lab.comm import Communicator
from zero_lab.exchange import FirstUse
from zero_lab.overlap import hook_with_zero_step_interleaved, prefetch_exchange


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


def _train_side_by_side(pairs: list[tuple[nn.Module, torch.optim.Optimizer]], steps: int = 3) -> None:
    """Each (model, optimizer) pair takes the same ``steps`` steps on the same inputs."""
    for step in range(steps):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        for module, optimizer in pairs:
            optimizer.zero_grad()
            module(x).pow(2).sum().backward()
            optimizer.step()


@pytest.mark.parametrize("partitioner", [SortedGreedy(), Flat()])
def test_world_of_one_issues_nothing_and_matches_adam(single_rank_group, partitioner):
    model, reference = _model(), _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    handle = prefetch_exchange(model, opt)
    _train_side_by_side([(model, opt), (reference, plain)])
    handle.remove()
    assert opt.comm_stats.calls == 0
    assert opt.exchange_report().collective == "none"
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


def test_unknown_exchange_is_named(single_rank_group):
    with pytest.raises(
        ValueError,
        match=r"exchange='ring' is not one of \['auto', 'broadcast', 'all_gather', 'p2p_all_gather', 'shm_all_gather']",
    ):
        ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, exchange="ring", lr=1e-2)


def test_partitioner_optim_and_pipeline_are_built_once_at_construction(single_rank_group):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=Flat(), lr=1e-2)
    pipeline = opt.pipeline
    assert opt.exchange_report().layout == "flat" and repr(opt.partitioner) == "Flat()"
    for name, value in (("partitioner", SortedGreedy()), ("optim", torch.optim.SGD(model.parameters(), lr=1.0))):
        with pytest.raises(AttributeError):
            setattr(opt, name, value)
    assert not hasattr(opt, "repartition")
    model[0].weight.grad = torch.ones_like(model[0].weight)
    opt.step()
    assert opt.pipeline is pipeline and opt.partition is pipeline.partition
    assert opt.optim is pipeline.optim.optimizers[0]
    assert opt.pipeline.report("auto")["param_exchange"]["timing"] == "after_step"
    assert opt.pipeline.report("auto")["grad_reduce"]["strategy"] == "ddp_all_reduce"


def test_world_of_one_overlap_hook_sends_nothing_and_matches_adam(single_rank_group):
    model, reference = _model(), _model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-2)
    ddp.register_comm_hook(None, hook_with_zero_step_interleaved(allreduce_hook, ddp, opt))
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    _train_side_by_side([(ddp, opt), (reference, plain)])
    assert opt.comm_stats.calls == 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


class _Unit:
    def __init__(self, *params: int):
        self.param_indices = frozenset(params)


def test_first_use_orders_units_by_their_earliest_used_parameter(single_rank_group):
    first_use = FirstUse()
    units = [_Unit(0, 1), _Unit(2), _Unit(3, 4), _Unit(5)]
    assert first_use.ordered(units) == units  # nothing agreed yet: buffer order
    comm = Communicator()
    first_use.agree(comm, 6, torch.device("cpu"))
    assert first_use.position is None and comm.stats.calls == 1  # nothing seen: try again next time
    first_use.note([2])
    first_use.note([4, 3])
    first_use.note([2, 1])  # already seen parameters keep their place
    first_use.agree(comm, 6, torch.device("cpu"))
    assert first_use.position == {2: 0, 4: 1, 3: 2, 1: 3}
    first_use.note([0, 5])  # ignored once agreed
    first_use.agree(comm, 6, torch.device("cpu"))  # agreed once: no further broadcast
    assert comm.stats.calls == 2
    assert [sorted(u.param_indices) for u in first_use.ordered(units)] == [[2], [3, 4], [0, 1], [5]]
