"""Owners are balanced over the parameters that get state (issue 30): a parameter known never
to receive a gradient (``ParamSpec.gets_grad=False``) loads its owner with nothing, in every
partitioner, in the report and in the planner; :class:`WithoutGradients` marks them for any
partitioner, and an optimizer re-partitions with it before its first step."""

from __future__ import annotations

import copy

import pytest
import torch

from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab.partition import (
    DdpBucket,
    ParamSpec,
    SortedGreedy,
    WithoutGradients,
    bucket_use,
    numel_cost,
    state_load,
)
from zero_lab.planner import plan_memory


def _specs() -> list[ParamSpec]:
    """The own-model example's shapes: ``aux`` (16384 + 128) is the largest and never used."""
    sizes = {"inp.weight": 4096, "inp.bias": 128, "out.weight": 1024, "out.bias": 8, "aux.weight": 16384,
             "aux.bias": 128}  # fmt: skip
    return [ParamSpec(numel=n, name=name, gets_grad=not name.startswith("aux"), bucket=0) for name, n in sizes.items()]


def test_a_parameter_without_gradients_costs_nothing():
    used, unused = ParamSpec(numel=10), ParamSpec(numel=10, gets_grad=False)
    assert (state_load(numel_cost, used), state_load(numel_cost, unused)) == (10, 0)


@pytest.mark.parametrize("partitioner", [SortedGreedy(), DdpBucket(shard_buckets=True)], ids=repr)
def test_whole_parameter_partitioners_balance_the_used_parameters(partitioner):
    specs = _specs()
    partition = partitioner(specs, 2)
    used = [0, 0]
    for index, owner in enumerate(partition.owners()):
        if specs[index].gets_grad:
            used[owner] += specs[index].numel
    assert sorted(used) == [1024 + 128 + 8, 4096]  # before: aux alone on one rank, every used one on the other
    assert partition.report().cost_per_rank == tuple(float(u) for u in used)


def test_flat_cuts_the_used_parameters_evenly_and_keeps_the_others_apart():
    specs = _specs()
    partition = Flat()(specs, 2)
    used = [0, 0]
    for shard in partition.shards:
        if specs[shard.param].gets_grad:
            used[shard.rank] += shard.numel
    assert used == [2628, 2628]  # (4096 + 128 + 1024 + 8) / 2
    assert [layout.params for layout in partition.layouts] == [(0, 1, 2, 3), (4, 5)]


def test_the_planner_gives_parameters_without_gradients_no_state():
    plan = plan_memory(_specs(), 2, SortedGreedy(), torch.optim.Adam)
    assert sorted(r.state_bytes for r in plan.ranks) == [(1024 + 128 + 8) * 8 + 3 * 4, 4096 * 8 + 4]


def test_without_gradients_marks_parameters_by_name_or_tensor_at_construction(single_rank_group):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 4), "aux": torch.nn.Linear(4, 4)})
    plain = ZeroRedundancyOptimizer(model.named_parameters(), torch.optim.Adam, lr=1e-2)
    assert all(spec.gets_grad for spec in plain.partition.specs)
    wrapped = WithoutGradients(SortedGreedy(), ["aux.weight", model["aux"].bias])
    assert repr(wrapped) == "WithoutGradients(SortedGreedy(), ['aux.weight'])"
    assert bucket_use(wrapped) == bucket_use(plain.partitioner)
    opt = ZeroRedundancyOptimizer(model.named_parameters(), torch.optim.Adam, partitioner=wrapped, lr=1e-2)
    assert [spec.gets_grad for spec in opt.partition.specs] == [True, True, False, False]
    model["used"](torch.ones(2, 4)).sum().backward()
    opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model["aux"].parameters(), copy_of_aux(model)))


def copy_of_aux(model: torch.nn.ModuleDict) -> list[torch.Tensor]:
    """``aux``'s parameters as they were built (seed 0): no gradient, so no step moved them."""
    torch.manual_seed(0)
    fresh = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 4), "aux": torch.nn.Linear(4, 4)})
    return list(fresh["aux"].parameters())


def test_without_gradients_keeps_ddp_bucket_use_and_copies_inner_when_set():
    inner = DdpBucket(shard_buckets=False)
    wrapped = WithoutGradients(inner, [])
    assert bucket_use(wrapped) == (True, False)
    twin = copy.copy(wrapped)
    twin.shard_buckets = True  # as attach_ddp's warning does on a copy: the original is untouched
    assert (bucket_use(twin), bucket_use(wrapped), inner.shard_buckets) == ((True, True), (True, False), False)
