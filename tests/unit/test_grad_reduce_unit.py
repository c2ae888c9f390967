"""zero_lab.grad_reduce without processes: the owner-by-owner bucket layout, the registry, the
bytes each strategy says it sends, and the config checks of grad_reduce= / release_grads=."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.preflight import preflight, problems
from zero_lab.grad_reduce import (
    GRAD_REDUCES,
    BucketRoute,
    _adjacent,
    grad_reduce_named,
    register_grad_reduce,
    registered_grad_reduces,
)
from zero_lab.partition import Flat, ParamSpec, SortedGreedy


def _specs(*numels: int) -> list[ParamSpec]:
    return [ParamSpec(numel=n) for n in numels]


def test_a_whole_parameter_partition_is_laid_out_owner_by_owner():
    specs = _specs(6, 2, 5, 3)
    partition = SortedGreedy()(specs, 2)
    assert partition.owners() == [0, 0, 1, 1]  # numel-balanced: 6 -> r0, 5 -> r1, 3 -> r1, 2 -> r0
    route = BucketRoute.of(partition, [3, 2, 1], [3, 5, 2])  # DDP's bucket: params 3, 2, 1 in that order
    # by hand: param 3 is elements 0-2 (rank 1), param 2 is 3-7 (rank 1), param 1 is 8-9 (rank 0)
    assert route.numel == 10
    assert route.runs == (((8, 10),), ((0, 8),))  # rank 1's two parameters are one run: adjacent
    flat = torch.arange(10.0)
    segments = route.segments(flat)
    assert [s.tolist() for s in segments] == [[8.0, 9.0], [float(i) for i in range(8)]]
    assert route.numels() == [2, 8]


def _owner_of_each_element(partition, params: list[int], numels: list[int]) -> list[int]:
    """Brute force, element by element: the rank owning each element of the bucket that holds
    ``params`` back to back (the shard whose range covers it)."""
    owners = []
    for param, numel in zip(params, numels):
        for element in range(numel):
            (rank,) = [s.rank for s in partition.shards if s.param == param and s.start <= element < s.stop]
            owners.append(rank)
    return owners


@pytest.mark.parametrize(
    ("partitioner", "numels", "bucket", "world"),
    [
        (Flat(), (7, 5, 9, 3), [2, 0, 3, 1], 3),  # Flat's ranges cut parameters; the bucket reorders them
        (Flat(), (4, 4, 4), [1, 2], 2),  # a bucket holding part of the parameters
        (SortedGreedy(), (1, 8, 2, 7, 3), [4, 0, 3, 2, 1], 3),
    ],
)
def test_each_ranks_runs_are_exactly_the_elements_it_owns_merged(partitioner, numels, bucket, world):
    """The runs, expanded element by element, are each rank's elements of the bucket; sorted,
    disjoint and maximal (two runs of one rank never touch: they would be one)."""
    partition = partitioner(_specs(*numels), world)
    sizes = [numels[i] for i in bucket]
    route = BucketRoute.of(partition, bucket, sizes)
    owner = _owner_of_each_element(partition, bucket, sizes)
    assert route.numel == len(owner) == sum(sizes)
    for rank, runs in enumerate(route.runs):
        assert [i for a, b in runs for i in range(a, b)] == [i for i, r in enumerate(owner) if r == rank]
        assert all(b < c for (_, b), (c, _) in itertools.pairwise(runs))  # sorted, disjoint, not touching
        assert all(a < b for a, b in runs)


def test_flat_cuts_a_parameter_inside_a_bucket_into_equal_ranges():
    specs = _specs(7, 5)
    partition = Flat()(specs, 2)  # one buffer of 12 elements, 6 per rank
    route = BucketRoute.of(partition, [0, 1], [7, 5])
    assert route.runs == (((0, 6),), ((6, 12),))  # param 0's last element joins param 1 on rank 1
    contiguous = route.segments(torch.zeros(12))
    assert all(s._base is not None for s in contiguous)  # one run each: views, no copy


def test_scatter_back_keeps_only_the_ranks_own_runs():
    route = BucketRoute((((0, 2), (5, 7)), ((2, 5), (7, 9))), 9)
    flat = torch.ones(9)
    route.scatter_back(flat, 0, torch.tensor([10.0, 11.0, 12.0, 13.0]))
    assert flat.tolist() == [10, 11, 0, 0, 0, 12, 13, 0, 0]


def test_native_reduce_scatter_stages_only_segments_that_are_not_the_bucket():
    """Equal runs back to back in one buffer (an evenly cut engine bucket) are reduced as they lie; an
    uneven cut, a gap, a run out of order or another buffer is staged (padded) instead."""
    bucket = torch.arange(12.0)
    even = [bucket[0:4], bucket[4:8], bucket[8:12]]
    whole = _adjacent(even, 4)
    assert whole is not None and whole.data_ptr() == bucket.data_ptr() and torch.equal(whole, bucket)
    assert _adjacent([bucket[4:8], bucket[8:12]], 4).data_ptr() == bucket[4:].data_ptr()  # from an offset
    assert _adjacent([bucket[0:5], bucket[5:8], bucket[8:12]], 5) is None  # uneven
    assert _adjacent([bucket[0:4], bucket[5:9]], 4) is None  # a gap
    assert _adjacent([bucket[4:8], bucket[0:4]], 4) is None  # out of rank order
    assert _adjacent([bucket[0:4], torch.arange(4.0)], 4) is None  # another buffer
    assert _adjacent([bucket[0:8:2], bucket[8:12]], 4) is None  # strided


def test_registry_names_and_refusals():
    assert GRAD_REDUCES[0] == "auto" and set(GRAD_REDUCES[1:]) <= set(registered_grad_reduces())
    with pytest.raises(ValueError, match=r"grad_reduce='ring' is not one of \['auto', 'all_reduce'"):
        grad_reduce_named("ring")

    class NotOne:
        name = "nope"

    with pytest.raises(TypeError, match="NotOne is not a GradReduce"):
        register_grad_reduce(NotOne)

    class Clash:
        name, label, scatters = "reduce_scatter", "x", True

        def issue(self, comm, segments, tag): ...

        def sent_bytes(self, numels, itemsize, world_size):
            return 0

    with pytest.raises(ValueError, match="grad_reduce='reduce_scatter' is already P2PReduceScatter"):
        register_grad_reduce(Clash)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("all_reduce", 2 * 100 * 4 * 2 // 3),
        ("reduce_scatter", 100 * 4 * 2 // 3),
        ("reduce_scatter_native", 120 * 4 * 2 // 3),
    ],
)
def test_bytes_sent_per_bucket(name, expected):
    """W=3, segments of 40, 40, 20 elements: an all-reduce sends twice a reduce-scatter's share;
    the native one pads every segment to the longest."""
    assert grad_reduce_named(name).sent_bytes([40, 40, 20], 4, 3) == expected


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["optim=adam", "grad_reduce=reduce_scatter"], "grad_reduce=reduce_scatter: optim=adam steps every parameter"),
        (["release_grads=true"], "release_grads=true with grad_reduce=null"),
        (["optim=adam", "grad_reduce=all_reduce", "release_grads=true"], "release_grads=true: optim=adam steps every"),
        (["grad_reduce=auto", "autocast=fp16"], "autocast=fp16 with grad_reduce=auto"),
        (["grad_reduce=ring"], "grad_reduce"),
    ],
)
def test_config_checks_refuse_naming_the_keys(overrides, fragment):
    assert fragment in problems(*overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["grad_reduce=reduce_scatter", "release_grads=true", "overlap=true", "partitioner=ddp_bucket"],
        ["optim=adam", "grad_reduce=all_reduce"],
        ["grad_reduce=all_reduce", "release_grads=true"],
        ["grad_reduce=auto", "partitioner=flat", "bucket_view=true", "prefetch=true"],
        # the engine shards whatever class steps: its Gloo modes named with optim=adam (scripts/bench_link.py)
        ["dp=zero_lab", "optim=adam", "grad_reduce=reduce_scatter", "exchange=all_gather"],
    ],
)
def test_config_checks_accept_the_modes(overrides):
    preflight(overrides)  # raises ConfigError on any problem


def test_closing_lines_say_the_strategy_the_bytes_and_the_gradients_held():
    from zero_lab.app.record.closing import grad_reduce_lines
    from zero_lab.app.record.summary import RunSummary

    summary = RunSummary(
        final_loss=1.0,
        losses=[1.0],
        world_size=2,
        steps=1,
        grad_reduce={"requested": "auto", "strategy": "reduce_scatter"},
        release_grads=True,
        grad_bytes=[3 * 2**20, 2 * 2**20],
        bytes_per_step={"grad_reduce": [2**20, 2**21], "param_exchange": [2**20, 2**20]},
    )
    assert grad_reduce_lines(summary) == [
        "  gradient reduction: reduce_scatter (grad_reduce=auto); sent per rank per step, measured (max over ranks): "
        "grad_reduce 2.00 MiB, param_exchange 1.00 MiB",
        "  gradients held per rank after backward (release_grads): 3.00 MiB at most",
    ]
    assert grad_reduce_lines(RunSummary(final_loss=1.0, losses=[1.0], world_size=2, steps=1)) == []


def test_reduce_gradients_attaches_the_pipelines_gradient_phase_once(single_rank_group):
    """The handle becomes the optimizer's gradient phase (not an attribute written from outside):
    the pipeline reports it, Join refuses it, and a second reduction of the same optimizer is refused."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zero_lab import ZeroRedundancyOptimizer
    from zero_lab.grad_reduce import reduce_gradients
    from zero_lab.pipeline import DdpAllReduce, GradReducePhase

    model = torch.nn.Linear(4, 3)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    assert isinstance(opt.pipeline.grad_reduce, DdpAllReduce)
    opt.join_hook()  # DDP's all-reduce: a joined rank can shadow it
    opt._end_join()
    handle = reduce_gradients(DDP(model), opt, "reduce_scatter", release_grads=True)
    assert opt.pipeline.grad_reduce is handle and isinstance(handle, GradReducePhase)
    assert opt.pipeline.report("auto")["grad_reduce"]["strategy"] == "reduce_scatter"
    with pytest.raises(RuntimeError, match="Join with grad_reduce"):
        opt.join_hook()
    with pytest.raises(RuntimeError, match="already reduced by 'reduce_scatter'; call reduce_gradients once"):
        reduce_gradients(DDP(model), opt, "all_reduce")
    handle.close()


def test_the_route_copies_a_sum_that_is_not_in_place():
    route = BucketRoute((((0, 2), (4, 6)), ((2, 4),)), 6)
    flat = torch.arange(6.0)
    route.scatter_back(flat, 0, torch.tensor([10.0, 11.0, 12.0, 13.0]))
    assert flat.tolist() == [10.0, 11.0, 0.0, 0.0, 12.0, 13.0]
    route.scatter_back(flat, 1, flat[2:4].add_(7.0))  # in place: the run itself
    assert flat.tolist() == [0.0, 0.0, 7.0, 7.0, 0.0, 0.0]
