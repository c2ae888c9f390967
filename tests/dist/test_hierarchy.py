"""Hierarchical sharding (``shard_size=2`` at W=4: shard groups [0,1] [2,3], replicas [0,2] [1,3])
on Gloo: training equal to DDP + the same optimizer (bitwise with DDP's all-reduce; 1e-6 when
gradients reduce inside the group, then across it), state bytes and traffic per link class as the
partition implies them (counted by hand from the partition, not by the Communicator's formulas),
torch's state-dict format from shard group 0, and a checkpoint saved at 2 × 2 resumed at W=2.

Two worlds in all: one of 4 ranks running every scenario, one of 2 resuming its checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import batch, loss_of, make_model, max_diff
from tests.dist.worlds import run_ranks
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.comm import INTER_GROUP, INTRA_GROUP, INTRA_NODE
from zero_lab.grad_reduce import reduce_gradients
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import Flat, SortedGreedy

STEPS = 4
LR = 1e-2


def _train(opt: torch.optim.Optimizer, ddp: DDP, first: int = 0, last: int = STEPS) -> None:
    for step in range(first, last):
        opt.zero_grad()
        loss_of(ddp, batch(step, dist.get_rank())).backward()
        opt.step()


def _reference(steps: int = STEPS) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    _train(opt, ddp, 0, steps)
    return model, opt


def _owned(opt: ZeroRedundancyOptimizer) -> int:
    """Elements this rank owns, from the partition."""
    return sum(s.stop - s.start for s in opt.partition.shards_of(opt.rank))


def _broadcast(opt: ZeroRedundancyOptimizer) -> int:
    """Elements this rank broadcasts per exchange: its range of each flat buffer (equal ranges, the
    last padded), else its owned elements."""
    if opt.partition.layouts:
        return sum(b - a for layout in opt.partition.layouts for a, b in [layout.bounds[opt.rank]])
    return _owned(opt)


def _parity(partitioner: Any, grad_reduce: str | None) -> dict[str, Any]:
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.Adam, partitioner=partitioner, exchange="broadcast", shard_size=2, lr=LR
    )
    handle = reduce_gradients(ddp, opt, grad_reduce) if grad_reduce else None
    before = opt.comm_stats.snapshot()
    _train(opt, ddp)
    ref_model, ref_opt = _reference()
    total = sum(p.numel() for p in model.parameters())
    owned = _owned(opt)
    out = {
        "diff": max_diff(model.parameters(), ref_model.parameters()),
        "shard": (opt.rank, opt.world_size, opt.shard_size, opt.hierarchy.group_index),
        "owned": owned,
        "broadcast": _broadcast(opt),
        "total": total,
        # Adam keeps exp_avg + exp_avg_sq (4 bytes each per owned element) and a step per shard tensor
        "state_bytes": optimizer_state_bytes(opt),
        "expected_state_bytes": 8 * owned + 4 * len(opt.local_shards()),
        "exchange_links": opt.comm_stats.since(before).sent_by_link,
        "exchange_sent": opt.comm_stats.since(before).sent_bytes,
        # the consolidated state equals the plain optimizer's, in torch's format
        "consolidated_diff": None,
    }
    opt.consolidate_state_dict(to=0)
    if dist.get_rank() == 0:
        mine, ref = opt.state_dict(), ref_opt.state_dict()
        assert sorted(mine["state"]) == sorted(ref["state"]) and mine["param_groups"][0].keys() >= {"lr", "params"}
        out["consolidated_diff"] = max(
            (mine["state"][i][k].float() - ref["state"][i][k].float()).abs().max().item()
            for i in ref["state"]
            for k in ("exp_avg", "exp_avg_sq", "step")
        )
    if handle is not None:
        out["grad_links"] = dict(handle.stats.sent_by_link)
        out["grad_sent"] = handle.stats.sent_bytes
        handle.close()
    return out


def _engine(partitioner: Any) -> dict[str, Any]:
    """zero_lab's engine with shard groups of 2: gradients reduced inside the group (point-to-point),
    each owned range all-reduced across the replicas, parameters gathered inside the group."""
    from zero_lab.engine import ShardedDataParallel

    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    engine = ShardedDataParallel(model, opt, partitioner=partitioner, grad_reduce="reduce_scatter", shard_size=2)
    _train(opt, engine)  # type: ignore[arg-type]
    engine.wait_for_params()
    ref_model, _ = _reference()
    owned = sum(b.owned_numel(engine.comm.rank) for b in engine.buckets)
    out = {
        "diff": max_diff(model.parameters(), ref_model.parameters()),
        "owned": owned,
        "total": sum(p.numel() for p in model.parameters()),
        # Flat cuts each bucket in equal ranges: the last one padded (the buffer is what moves)
        "laid_out": sum(b.bounds[-1][1] - b.bounds[0][0] for b in engine.buckets),
        "buckets": len(engine.buckets),
        "grad_links": dict(engine.comm.stats.sent_by_link),
        "state_bytes": optimizer_state_bytes(opt),
        "expected_state_bytes": 8 * owned + 4 * sum(len(g["params"]) for g in opt.param_groups),
        "shard": (engine.comm.rank, engine.comm.world_size, engine.modes()["shard_size"]),
    }
    engine.close()
    return out


def _dcp_round_trip(model: torch.nn.Module, opt: ZeroRedundancyOptimizer, path: str) -> float:
    """torch.distributed.checkpoint of a 2 × 2 optimizer (every replica offers its shards' state),
    loaded into a fresh 2 × 2 sorted-greedy one: the largest difference of any state tensor."""
    import zero_lab.dcp

    zero_lab.dcp.save({"optim": zero_lab.dcp.get_optimizer_state_dict(model, opt)}, path)
    model.zero_grad(set_to_none=True)  # the fresh optimizer's template: its state made by a zero step
    fresh = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.Adam, partitioner=SortedGreedy(), shard_size=2, lr=LR
    )
    template = {"optim": zero_lab.dcp.get_optimizer_state_dict(model, fresh)}
    zero_lab.dcp.load(template, path)
    zero_lab.dcp.set_optimizer_state_dict(model, fresh, template["optim"])
    opt.consolidate_state_dict(to=0)
    fresh.consolidate_state_dict(to=0)
    if dist.get_rank() != 0:
        return 0.0
    mine, theirs = opt.state_dict()["state"], fresh.state_dict()["state"]
    assert sorted(mine) == sorted(theirs)
    return max((mine[i][k].float() - theirs[i][k].float()).abs().max().item() for i in mine for k in mine[i])


def _muon() -> dict[str, Any]:
    """Muon beside AdamW (whole matrices, balanced by Newton–Schulz cost) at 2 × 2 against DDP + torch's
    Muon and AdamW routed by hand (tests/dist/test_muon.py's model and reference)."""
    from tests.dist.test_muon import MuonCase, train

    case = MuonCase(partitioner=SortedGreedy(cost="newton_schulz"), shard_size=2)
    ours, (zero,), _ = train(case, zero=True)
    theirs, _, _ = train(case, zero=False)
    assert isinstance(zero, ZeroRedundancyOptimizer)
    return {
        "diff": max_diff(ours.parameters(), theirs.parameters()),
        "owners": zero.partition.owners(),
        "classes": sorted(type(o).__name__ for o in zero.optim.optimizers),
    }


def _auto_prefetch() -> float:
    """``grad_reduce="auto"`` (trials inside the shard group) and ``exchange="auto"`` with the exchange
    prefetched behind the next forward, at 2 × 2: the largest difference from DDP + Adam."""
    from zero_lab.overlap import prefetch_exchange

    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=Flat(), shard_size=2, lr=LR)
    handle = reduce_gradients(ddp, opt, "auto")
    prefetch = prefetch_exchange(model, opt)
    _train(opt, ddp)
    opt.wait_for_exchange()
    prefetch.remove()
    handle.close()
    ref_model, _ = _reference()
    return max_diff(model.parameters(), ref_model.parameters())


def _refusals() -> list[str]:
    model = make_model()
    errors = []
    try:
        ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=LR, shard_size=3)
    except ValueError as error:
        errors.append(str(error))
    return errors


def _overlap(interleaved: bool) -> dict[str, Any]:
    """The DDP overlap hooks at 2 × 2: DDP's all-reduce over the world, then each shard group steps its
    replica of the state per bucket and broadcasts inside the group (its own exchange groups)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved

    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.Adam, overlap_with_ddp=True, shard_size=2, lr=LR
    )  # fmt: skip
    wrap = hook_with_zero_step_interleaved if interleaved else hook_with_zero_step
    ddp.register_comm_hook(None, wrap(allreduce_hook, ddp, opt))
    before = opt.comm_stats.snapshot()
    _train(opt, ddp)
    ref_model, _ = _reference()
    return {
        "diff": max_diff(model.parameters(), ref_model.parameters()),
        "links": opt.comm_stats.since(before).sent_by_link,
    }


def hierarchical_world(directory: str) -> dict[str, Any]:
    """Every W=4 scenario in one world (each builds its groups once: the same ranks and S reuse them)."""
    from zero_lab.checkpoint import save_checkpoint

    out: dict[str, Any] = {
        "all_reduce": _parity(SortedGreedy(), None),
        "flat_all_reduce": _parity(Flat(), None),
        "reduce_scatter": _parity(SortedGreedy(), "reduce_scatter"),
        "flat_reduce_scatter": _parity(Flat(), "reduce_scatter"),
        "refusals": _refusals(),
        "overlap": _overlap(interleaved=False),
        "overlap_interleaved": _overlap(interleaved=True),
        "engine": _engine(Flat()),
        "engine_sorted_greedy": _engine(SortedGreedy()),
        "muon": _muon(),
        "auto_prefetch": _auto_prefetch(),
    }
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=Flat(), shard_size=2, lr=LR)
    _train(opt, ddp, 0, 2)
    save_checkpoint(directory, opt, model, extra={"step": 2})
    out["dcp"] = _dcp_round_trip(model, opt, directory + "-dcp")
    _train(opt, ddp, 2, STEPS)
    ref_model, _ = _reference()
    out["resume_reference"] = [p.detach().clone() for p in ref_model.parameters()]
    out["files"] = sorted(p.name for p in Path(directory).iterdir())
    return out


def resume_world(directory: str) -> list[torch.Tensor]:
    """W=2, one shard group: load the 2 × 2 checkpoint and train on with W=4's batches."""
    from zero_lab.checkpoint import load_checkpoint

    model = make_model(seed=99)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=SortedGreedy(), lr=LR)
    extra = load_checkpoint(directory, opt, model)
    ddp = DDP(model, bucket_cap_mb=0.002)
    for step in range(extra["step"], STEPS):
        opt.zero_grad()
        # the W=4 world's global batch, split over 2 ranks: the same mean gradient
        x = torch.cat([batch(step, 2 * dist.get_rank()), batch(step, 2 * dist.get_rank() + 1)])
        loss_of(ddp, x).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_two_by_two(tmp_path: Any) -> None:
    directory = str(tmp_path / "step_2")
    ranks = run_ranks(hierarchical_world, 4, directory)

    for rank, out in enumerate(ranks):
        for name in ("all_reduce", "flat_all_reduce"):
            case = out[name]
            assert case["shard"] == (rank % 2, 2, 2, rank // 2)
            assert case["diff"] == 0.0, (name, rank)  # DDP's all-reduce, then the same Adam: bitwise
            assert case["state_bytes"] == case["expected_state_bytes"], (name, rank)
        for name in ("reduce_scatter", "flat_reduce_scatter"):
            assert out[name]["diff"] <= 1e-6, (name, rank, out[name]["diff"])  # the sum's order differs

    for name in ("all_reduce", "flat_all_reduce", "reduce_scatter", "flat_reduce_scatter"):
        # replicas: ranks r and r+2 own the same elements; a shard group owns the whole model once
        owned = [out[name]["owned"] for out in ranks]
        assert owned[0] == owned[2] and owned[1] == owned[3] and owned[0] + owned[1] == ranks[0][name]["total"]
        limit = 0.0 if name.endswith("all_reduce") else 1e-6
        assert ranks[0][name]["consolidated_diff"] <= limit, (name, ranks[0][name]["consolidated_diff"])
        for out in ranks:
            case = out[name]
            # the exchange: each rank broadcasts its owned elements (fp32) to its one peer in the shard group
            assert case["exchange_sent"] == 4 * case["broadcast"] * STEPS
            assert case["exchange_links"] == {INTRA_GROUP: case["exchange_sent"], INTRA_NODE: case["exchange_sent"]}
    for name in ("reduce_scatter", "flat_reduce_scatter"):
        for out in ranks:
            case = out[name]
            # inside the group every rank sends its peer the peer's elements: all but its own; across groups
            # the owner's segment is all-reduced between 2 replicas (a ring: 2n(R-1)/R = n bytes sent)
            intra, inter = 4 * (case["total"] - case["owned"]) * STEPS, 4 * case["owned"] * STEPS
            assert case["grad_links"] == {INTRA_GROUP: intra, INTER_GROUP: inter, INTRA_NODE: intra + inter}
            assert case["grad_sent"] == intra + inter

    for name in ("engine", "engine_sorted_greedy"):
        owned = [out[name]["owned"] for out in ranks]
        assert owned[0] == owned[2] and owned[1] == owned[3] and owned[0] + owned[1] == ranks[0][name]["laid_out"]
        for rank, out in enumerate(ranks):
            case = out[name]
            assert case["total"] <= case["laid_out"] < case["total"] + 2 * case["buckets"]
            assert case["shard"] == (rank % 2, 2, 2)
            assert case["diff"] <= 1e-6, (name, rank, case["diff"])  # reduced inside the group, then across
            assert case["state_bytes"] == case["expected_state_bytes"]
            # the initial broadcast from rank 0 to all four crosses groups too (rank 0 only: 3 copies of the model)
            setup = 3 * 4 * case["total"] if rank == 0 else 0
            intra, inter = 4 * (case["laid_out"] - case["owned"]) * STEPS, 4 * case["owned"] * STEPS + setup
            assert case["grad_links"] == {INTRA_GROUP: intra, INTER_GROUP: inter, INTRA_NODE: intra + inter}

    assert [out["dcp"] for out in ranks] == [0.0] * 4  # DCP at 2 × 2 (Flat) into 2 × 2 (sorted-greedy): exact

    muon = [out["muon"] for out in ranks]
    assert [m["diff"] for m in muon] == [0.0] * 4  # DDP's all-reduce, Muon on whole matrices: bitwise
    assert muon[0]["owners"] == muon[2]["owners"] and set(muon[0]["owners"]) == {0, 1}  # a partition over 2 ranks
    assert {c for m in muon for c in m["classes"]} == {"AdamW", "Muon"}

    assert all(out["auto_prefetch"] <= 1e-6 for out in ranks), [out["auto_prefetch"] for out in ranks]

    errors = ranks[0]["refusals"]
    assert len(errors) == 1
    assert "shard_size=3 does not divide the world size 4" in errors[0] and "[1, 2, 4]" in errors[0]

    for name in ("overlap", "overlap_interleaved"):
        for out in ranks:
            assert out[name]["diff"] == 0.0, (name, out[name]["diff"])  # DDP's all-reduce, then the same Adam
        links = [out[name]["links"] for out in ranks]
        assert links[0] == links[2] and links[1] == links[3], links  # replicas broadcast the same shards
        assert any(links) and all(set(link) <= {INTRA_GROUP, INTRA_NODE} for link in links), links  # never across

    # shard group 0 wrote the checkpoint: the manifest, the model and its two ranks' files
    assert ranks[0]["files"] == ["manifest.json", "model.pt", "optim-rank00000.pt", "optim-rank00001.pt"]
    resumed = run_ranks(resume_world, 2, directory)
    for params in resumed:
        assert max_diff(params, ranks[0]["resume_reference"]) <= 1e-6


def one_rank_skips_a_replica_collective() -> str:
    """Rank 0 all-reduces over its replica group ([0, 1] at S=1); rank 1 never does and outlives the
    world's timeout: rank 0's wait must end at the world's timeout (3 s), not torch's 30 minutes."""
    from zero_lab.hierarchy import hierarchy_of

    groups = hierarchy_of(None, 1)
    if dist.get_rank() == 1:
        import time

        time.sleep(8)
        return ""
    try:
        dist.all_reduce(torch.ones(4), group=groups.replica_group)
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_the_groups_zero_lab_creates_time_out_as_the_world_does() -> None:
    # without the world's timeout the wait would outlive the world's deadline (timeout_s + 30 s)
    waited = run_ranks(one_rank_skips_a_replica_collective, 2, timeout_s=3)[0]
    assert "Timed out" in waited and "3000" in waited, waited
