"""Overlapped ZeRO (DDP comm hooks) on Gloo: every step equals the non-overlapped run from step 1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import OPTIMIZERS, batch, loss_of, make_model, param_groups
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.partition import Flat, Partitioner


@dataclass
class OverlapCase:
    """Overlap run vs the same ZeRO run without overlap and vs DDP + the plain optimizer."""

    optimizer: str = "adam"
    interleaved: bool = False
    shard_buckets: bool = False
    layout: str = "tensors"
    steps: int = 6
    static_graph: bool = False
    accumulate: int = 1  # micro-batches per step (the first ones under no_sync)
    unused: bool = False  # a parameter no rank uses (find_unused_parameters=True)
    bucket_cap_mb: float = 0.002  # tiny buckets so the small model spans several
    partitioner: Partitioner | None = None


TOL = 1e-6

CASES: dict[str, OverlapCase] = {}
for interleaved in (False, True):
    for shard in (False, True):
        for opt in ("adam", "sgd"):
            name = f"{'interleaved' if interleaved else 'after-all'}-shard{int(shard)}-{opt}-2groups"
            CASES[name] = OverlapCase(optimizer=opt, interleaved=interleaved, shard_buckets=shard, layout="groups")
CASES.update(
    {
        "adamw": OverlapCase(optimizer="adamw", interleaved=True),
        "rmsprop": OverlapCase(optimizer="rmsprop", interleaved=True, shard_buckets=True),
        "adagrad": OverlapCase(optimizer="adagrad"),
        "static-graph": OverlapCase(static_graph=True, interleaved=True),
        "static-graph-after-all": OverlapCase(static_graph=True),
        "no-sync-accumulation": OverlapCase(accumulate=3, interleaved=True),
        "unused-parameter": OverlapCase(
            unused=True, interleaved=True, optimizer="adamw"
        ),  # decay moves a wrongly stepped param
        "flat-partitioner": OverlapCase(partitioner=Flat(), interleaved=True),
        "one-big-bucket": OverlapCase(bucket_cap_mb=25, interleaved=True),
    }
)


@pytest.fixture(scope="module")
def results_w2(world):
    rows = world(overlap_parity, 2, list(CASES.values()))
    return {name: [rank_rows[i] for rank_rows in rows] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_overlap_equals_plain_ddp_and_unoverlapped_zero_from_step_one(results_w2, name):
    for row in results_w2[name]:
        assert row["vs_zero"] <= TOL and row["vs_plain"] <= TOL, (name, row["vs_zero"], row["vs_plain"])
        losses = row["losses"]
        assert losses["overlap"] == pytest.approx(losses["zero"], abs=TOL)
        assert losses["overlap"] == pytest.approx(losses["plain"], abs=TOL)
        assert losses["overlap"][1] != losses["overlap"][0]  # the first update was applied


def test_three_ranks_both_hooks(world):
    cases = [OverlapCase(interleaved=True, shard_buckets=True, layout="groups"), OverlapCase(optimizer="sgd")]
    for rank_rows in world(overlap_parity, 3, cases):
        for row in rank_rows:
            assert row["vs_zero"] <= TOL and row["vs_plain"] <= TOL


def test_trainability_change_raises_clearly(world):
    for message in world(overlap_trainability_change, 2, timeout_s=60):
        assert "trainability changed while overlap_with_ddp=True" in message


def test_a_model_with_an_overlap_hook_is_freed(single_rank_group):
    """DDP's C++ reducer holds the hook; nothing the hook holds may lead back to DDP, or
    the cycle (invisible to the garbage collector) keeps model and optimizer alive."""
    import gc
    import weakref

    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zero_lab import ZeroRedundancyOptimizer
    from zero_lab.overlap import hook_with_zero_step_interleaved

    def train_one_step() -> list[weakref.ref]:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        ddp = DDP(model)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-3)
        ddp.register_comm_hook(None, hook_with_zero_step_interleaved(allreduce_hook, ddp, opt))
        ddp(torch.randn(3, 4)).sum().backward()
        return [weakref.ref(model), weakref.ref(ddp), weakref.ref(opt)]

    refs = train_one_step()
    gc.collect()
    assert [ref() is None for ref in refs] == [True, True, True]


# ---------------------------------------------------------------- rank programs
class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = make_model()
        self.spare = nn.Linear(3, 3)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _overlap_train(case: OverlapCase, mode: str) -> tuple[nn.Module, list[float]]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = WithUnused() if case.unused else make_model()
    ddp = DDP(
        model,
        bucket_cap_mb=case.bucket_cap_mb,
        static_graph=case.static_graph,
        find_unused_parameters=case.unused,
    )
    cls, kwargs = OPTIMIZERS[case.optimizer]
    params = param_groups(model, case.layout)
    if mode == "plain":
        opt: torch.optim.Optimizer = cls(params, **kwargs)
    else:
        overlap = mode == "overlap"
        opt = ZeroRedundancyOptimizer(params, cls, overlap_with_ddp=overlap, partitioner=case.partitioner, **kwargs)
        if overlap:
            wrap = hook_with_zero_step_interleaved if case.interleaved else hook_with_zero_step
            ddp.register_comm_hook(None, wrap(allreduce_hook, ddp, opt, shard_buckets=case.shard_buckets))
    losses = []
    for step in range(case.steps):
        opt.zero_grad()
        total = 0.0
        for micro in range(case.accumulate):
            x = batch(step * case.accumulate + micro, rank)
            if micro < case.accumulate - 1:
                with ddp.no_sync():
                    loss = loss_of(ddp, x) / case.accumulate
                    loss.backward()
            else:
                loss = loss_of(ddp, x) / case.accumulate
                loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return model, losses


def overlap_parity(cases: list[OverlapCase]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        runs = {mode: _overlap_train(case, mode) for mode in ("overlap", "zero", "plain")}
        params = {mode: list(model.parameters()) for mode, (model, _) in runs.items()}

        def diff(a: str, b: str, params: dict[str, list[torch.Tensor]] = params) -> float:
            return max((x - y).abs().max().item() for x, y in zip(params[a], params[b]))

        out.append(
            {
                "vs_zero": diff("overlap", "zero"),
                "vs_plain": diff("overlap", "plain"),
                "losses": {mode: losses for mode, (_, losses) in runs.items()},
            }
        )
    return out


def overlap_trainability_change() -> str:
    """Changing requires_grad mid-run under overlap must raise a clear error, not hang."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab.overlap import hook_with_zero_step

    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-2)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, opt))
    loss_of(ddp, batch(0, dist.get_rank())).backward()
    next(model.parameters()).requires_grad_(False)
    try:
        loss_of(ddp, batch(1, dist.get_rank())).backward()
    except RuntimeError as error:
        return str(error)
    return "no error"
