"""ZeRO vs DDP + the same plain optimizer, on real Gloo worlds.

Many scenarios run inside one world (module fixture) and each test reads its row;
that keeps the multi-process cost to a few worlds for the whole file.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import Case, batch, loss_of, make_model, max_diff, param_groups, parity, zero_or_plain
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.partition import Flat, Manual, Partitioner

TOL = 1e-6  # float32, same arithmetic: most cases are bitwise equal

CASES: dict[str, Case] = {}
for opt in ("adam", "adamw", "sgd"):
    for bucket_view in (False, True):
        CASES[f"{opt}-bucket{int(bucket_view)}"] = Case(optimizer=opt, bucket_view=bucket_view)
CASES.update(
    {
        "two-groups": Case(layout="groups", optimizer="adamw"),
        "two-groups-bucket": Case(layout="groups", optimizer="adamw", bucket_view=True),
        "named-params": Case(layout="named"),
        "frozen": Case(frozen=(0, 1)),
        "unfreeze-mid-run": Case(frozen=(0, 1), unfreeze_at=4, bucket_view=True),
        "freeze-mid-run": Case(freeze_at=5, bucket_view=True),
        "closure": Case(closure=True),
        "lr-scheduler": Case(scheduler=True, optimizer="sgd"),
        "manual": Case(layout="named", partitioner=Manual([["0.*", "4.*"], ["2.*", "6.*"]])),
        "flat-adam": Case(partitioner=Flat()),
        "flat-bucket-groups": Case(partitioner=Flat(), bucket_view=True, layout="groups"),
        "flat-sgd-closure": Case(partitioner=Flat(), optimizer="sgd", closure=True),
        "flat-rmsprop-frozen": Case(partitioner=Flat(), optimizer="rmsprop", frozen=(2,), unfreeze_at=5),
        "flat-adagrad": Case(partitioner=Flat(), optimizer="adagrad"),
        "flat-adamw-groups-bucket": Case(partitioner=Flat(), optimizer="adamw", layout="groups", bucket_view=True),
    }
)


@pytest.fixture(scope="module")
def results_w2(world):
    rows = world(parity, 2, list(CASES.values()))
    return {name: [rank_rows[i] for rank_rows in rows] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_match_ddp_plus_plain_optimizer(results_w2, name):
    per_rank = results_w2[name]
    for row in per_rank:
        assert row["max_diff"] <= TOL, (name, row["max_diff"])
        assert row["zero_losses"] == pytest.approx(row["ref_losses"], abs=TOL)
    assert len({row["checksum"] for row in per_rank}) == 1, "replicas differ across ranks"


def test_adam_state_is_about_half_per_rank_at_w2(results_w2):
    for row in results_w2["adam-bucket0"]:
        bound = 0.5 * row["ref_state_bytes"] + row["largest_param_state_bytes"]
        assert row["state_bytes"] <= bound
    total = sum(row["state_bytes"] for row in results_w2["adam-bucket0"])
    assert total == pytest.approx(results_w2["adam-bucket0"][0]["ref_state_bytes"], rel=0.01)


def test_flat_state_is_exactly_its_range(results_w2):
    rows = results_w2["flat-adam"]
    sizes = [row["state_bytes"] for row in rows]
    assert max(sizes) - min(sizes) <= 2 * 4 + 8  # one element of exp_avg/exp_avg_sq + a step counter


def test_three_ranks(world):
    """Flat at W=3 on the default model (1083 elements: no padding) and on one of 1016 elements
    (groups of 961 and 55): each buffer padded to a multiple of 3, the last rank's range short."""
    padded = [sum(p.numel() for p in make_model(width=23).parameters() if p.dim() == d) % 3 for d in (1, 2)]
    assert padded == [1, 1]  # biases and weights: neither a multiple of 3
    cases = [
        Case(bucket_view=True),
        Case(partitioner=Flat(), layout="groups"),
        Case(optimizer="sgd"),
        Case(partitioner=Flat(), width=23),
        Case(partitioner=Flat(), layout="groups", bucket_view=True, width=23),
    ]
    for rank_rows in world(parity, 3, cases):
        for row in rank_rows:
            assert row["max_diff"] <= TOL
            assert row["zero_losses"] == pytest.approx(row["ref_losses"], abs=TOL)


@pytest.mark.parametrize("bucket_view", [False, True])
def test_same_owners_and_parameters_as_torch_zero(world, bucket_view):
    for row in world(versus_torch, 2, bucket_view):
        assert row["owners_equal"]
        assert row["max_diff"] == 0.0


@pytest.mark.parametrize("partitioner", [None, Flat()], ids=["sorted_greedy", "flat"])
def test_consolidated_state_round_trips_through_zero_and_plain_adam(world, partitioner):
    for row in world(checkpoint_round_trip, 2, partitioner):
        assert row["diffs"] == {"zero": 0.0, "plain": 0.0, "plain_then_zero": 0.0}
        assert row["state_keys"] == list(range(8))


def test_join_with_uneven_inputs_matches_ddp(world):
    for row in world(uneven_join, 2, [3, 6]):
        assert row["max_diff"] <= TOL


# ---------------------------------------------------------------- rank programs
def versus_torch(bucket_view: bool, steps: int = 8) -> dict[str, Any]:
    """zero_lab against torch.distributed.optim.ZeroRedundancyOptimizer: owners and parameters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    results = {}
    models = {}
    for name, cls in (("zero_lab", ZeroRedundancyOptimizer), ("torch", TorchZero)):
        model = make_model()
        ddp = DDP(model)
        opt = cls(param_groups(model, "groups"), torch.optim.Adam, parameters_as_bucket_view=bucket_view, lr=1e-2)
        for step in range(steps):
            opt.zero_grad()
            loss_of(ddp, batch(step, dist.get_rank())).backward()
            opt.step()
        models[name] = model
        results[name] = opt
    params = list(models["zero_lab"].parameters())
    torch_owner = results["torch"]._param_to_rank
    torch_order = [p for group in results["torch"].param_groups for p in group["params"]]
    return {
        "owners_equal": results["zero_lab"].partition.owners() == [torch_owner[p] for p in torch_order],
        "max_diff": max_diff(params, models["torch"].parameters()),
    }


def checkpoint_round_trip(partitioner: Partitioner | None = None, steps: int = 6) -> dict[str, Any]:
    """Train, consolidate, save; load into fresh ZeRO and into plain Adam (and back); continue.

    Returns the max parameter difference of each continued run against the
    uninterrupted ZeRO run, and whether rank 0's consolidated state loads into Adam.
    """
    rank = dist.get_rank()

    def fresh(zero: bool, model: nn.Module) -> torch.optim.Optimizer:
        if zero:
            return ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
        return torch.optim.Adam(model.parameters(), lr=1e-2)

    def run(ddp: DDP, opt: torch.optim.Optimizer, first: int, last: int) -> None:
        for step in range(first, last):
            opt.zero_grad()
            loss_of(ddp, batch(step, rank)).backward()
            opt.step()

    model = make_model()
    ddp = DDP(model)
    opt = fresh(True, model)
    run(ddp, opt, 0, steps)
    opt.consolidate_state_dict(to=0)
    blob = io.BytesIO()
    if rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, blob)
    payload = [blob.getvalue()]
    dist.broadcast_object_list(payload, src=0)
    run(ddp, opt, steps, 2 * steps)
    target = [p.detach().clone() for p in model.parameters()]

    diffs = {}
    # zero: a fresh ZeRO loads the consolidated state; plain: a plain Adam on every rank loads it;
    # plain_then_zero: the plain Adam's own state_dict() goes back into a fresh ZeRO.
    for mode in ("zero", "plain", "plain_then_zero"):
        # Fresh from bytes each time: load_state_dict aliases the given tensors (as torch's does).
        saved = torch.load(io.BytesIO(payload[0]), weights_only=True)
        model2 = make_model(seed=123)
        model2.load_state_dict(saved["model"])
        ddp2 = DDP(model2)
        opt2 = fresh(mode == "zero", model2)
        opt2.load_state_dict(saved["optim"])
        if mode == "plain_then_zero":
            plain_state = opt2.state_dict()
            opt2 = fresh(True, model2)
            opt2.load_state_dict(plain_state)
        run(ddp2, opt2, steps, 2 * steps)
        diffs[mode] = max_diff(model2.parameters(), target)
    return {"diffs": diffs, "state_keys": sorted(saved["optim"]["state"].keys())}


def uneven_join(steps_per_rank: list[int]) -> dict[str, Any]:
    """Uneven inputs under Join: ZeRO+DDP against DDP+Adam on the ranks still training."""
    rank = dist.get_rank()
    models = {}
    for mode in ("zero", "plain"):
        model = make_model()
        ddp = DDP(model)
        opt = zero_or_plain(mode, model.parameters(), lr=1e-2)
        with Join([ddp, opt] if mode == "zero" else [ddp]):
            for step in range(steps_per_rank[rank]):
                opt.zero_grad()
                loss_of(ddp, batch(step, rank)).backward()
                opt.step()
        models[mode] = model
    # Gather the plain run's parameters from the rank that trained longest: that is DDP's answer.
    longest = max(range(len(steps_per_rank)), key=lambda r: steps_per_rank[r])
    reference = [p.detach().clone() for p in models["plain"].parameters()]
    for tensor in reference:
        dist.broadcast(tensor, src=longest)
    return {"max_diff": max_diff(models["zero"].parameters(), reference)}
