"""zero_lab's own data-parallel engine (``ShardedDataParallel``) against DDP + the same optimizer.

Parity per partitioner x prefetch x accumulation x optimizer, all cases of a world in one world
(bitwise at W=2, 1e-6 at W=3); a shard group of one (W=1, ``shard_size=1``: no collective inside
it, bitwise); parameters no gradient reaches and frozen ones; the gradient
bytes a rank holds (measured on the buffers) against the bound Ψ/W + two buckets and against
the Ψ DDP holds; what the reductions send; and nothing in flight after ``close()``, ten times.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import OPTIMIZERS, batch, loss_of, make_model
from zero_lab import ShardedDataParallel
from zero_lab.partition import DdpBucket, Flat, Manual, SortedGreedy


@dataclass(frozen=True)
class EngineCase:
    partitioner: str = "flat"
    prefetch: bool = True
    accumulate: int = 1
    optimizer: str = "adam"
    grad_reduce: str | None = None
    steps: int = 4
    exchange: str | None = None


def _partitioner(name: str) -> Any:
    return {
        "flat": Flat(),
        "sorted_greedy": SortedGreedy(),
        "ddp_bucket": DdpBucket(shard_buckets=True),  # follows the engine's own buckets
        "manual": Manual(order=["*"]),
    }[name]


def _train_pair(case: EngineCase, build: Any) -> dict[str, Any]:
    """DDP + the optimizer and the engine + the same optimizer, side by side on the same batches."""
    rank = torch.distributed.get_rank()
    cls, kwargs = OPTIMIZERS[case.optimizer]
    reference, model = build(), build()
    ddp = DDP(reference, find_unused_parameters=True)
    plain = cls([p for p in reference.parameters() if p.requires_grad], **kwargs)
    opt = cls([p for p in model.parameters() if p.requires_grad], **kwargs)
    engine = ShardedDataParallel(
        model,
        opt,
        partitioner=_partitioner(case.partitioner),
        prefetch=case.prefetch,
        grad_reduce=case.grad_reduce,
        exchange=case.exchange,
        bucket_cap_mb=0.001,  # about a layer of the small model per bucket
    )
    losses: dict[str, list[float]] = {"ddp": [], "engine": []}
    for step in range(case.steps):
        for name, wrapped, optimizer in (("ddp", ddp, plain), ("engine", engine, opt)):
            optimizer.zero_grad()
            for micro in range(case.accumulate):
                x = batch(10 * step + micro, rank)
                if micro < case.accumulate - 1:
                    with wrapped.no_sync():
                        loss_of(wrapped, x).backward()
                else:
                    loss = loss_of(wrapped, x)
                    loss.backward()
            losses[name].append(loss.item())
            optimizer.step()
    engine.close()
    diff = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters()))
    return {
        "diff": diff,
        "losses_equal": losses["ddp"] == losses["engine"],
        "peak": engine.peak_grad_bytes,
        "bound": engine.grad_hold_bound(),
        "psi": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
        "buckets": len(engine.buckets),
        "in_flight": engine.group.in_flight,
        "modes": (engine.grad_reduce, engine.exchange, engine.transport_note),
        "collectives": engine.comm_stats.calls,
        "state_numel": sum(t.numel() for s in opt.state.values() for t in s.values() if t.dim()),
    }


def _parity_cases(cases: list[EngineCase]) -> list[dict[str, Any]]:
    return [_train_pair(case, make_model) for case in cases]


#: Over Gloo, point-to-point, named (the defaults go through host shared memory on one x86-64 host:
#: the same matrix for them is tests/dist/test_host_shm.py's).
P2P = {"grad_reduce": "reduce_scatter", "exchange": "p2p_all_gather"}
W2_CASES = [
    EngineCase(partitioner, prefetch, accumulate, optimizer, **P2P)
    for partitioner in ("flat", "sorted_greedy")
    for prefetch in (True, False)
    for accumulate in (1, 2)
    for optimizer in ("adam", "adamw", "sgd")
    if optimizer == "adam" or (prefetch and accumulate == 1)
] + [EngineCase(grad_reduce=name) for name in ("all_reduce", "reduce_scatter_native")]
W2_CASES += [EngineCase("ddp_bucket"), EngineCase("manual", prefetch=False, accumulate=2), EngineCase()]


def test_parity_with_ddp_bitwise_at_two_ranks(world):
    results = world(_parity_cases, 2, W2_CASES)
    for rank_results in results:
        for case, result in zip(W2_CASES, rank_results):
            assert result["diff"] == 0.0 and result["losses_equal"], (case, result)
            assert result["in_flight"] == 0 and result["buckets"] >= 3
            assert 0 < result["peak"] <= result["bound"], (case, result)
    # the optimizer state is sharded: the ranks' Adam states together are about the model's
    adam = next(i for i, c in enumerate(W2_CASES) if c.optimizer == "adam" and c.partitioner == "flat")
    states = [r[adam]["state_numel"] for r in results]
    assert sum(states) == pytest.approx(2 * 1083, abs=2 * 2 * results[0][adam]["buckets"])  # exp_avg + exp_avg_sq


W1_CASES = [
    EngineCase(),
    EngineCase(prefetch=False, accumulate=2),
    EngineCase("sorted_greedy", optimizer="adamw"),
    EngineCase(optimizer="sgd", grad_reduce="all_reduce"),
]


def test_one_rank_issues_no_collective_and_matches_ddp(world):
    """W=1 (a shard group of one): the bucket's buffer is the whole gradient and this rank owns it, so the
    engine issues no collective at all (DDP still all-reduces) and steps bitwise as DDP + the optimizer."""
    (rank_results,) = world(_parity_cases, 1, W1_CASES)
    for case, result in zip(W1_CASES, rank_results):
        assert result["diff"] == 0.0 and result["losses_equal"], (case, result)
        assert result["collectives"] == 0 and result["in_flight"] == 0, (case, result)
        assert 0 < result["peak"] <= result["bound"], (case, result)


def _replicas_only_program() -> dict[str, Any]:
    rank = torch.distributed.get_rank()
    reference, model = make_model(), make_model()
    ddp = DDP(reference)
    plain, opt = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (reference, model))
    with ShardedDataParallel(model, opt, shard_size=1, bucket_cap_mb=0.001) as engine:
        for step in range(4):
            for wrapped, optimizer in ((ddp, plain), (engine, opt)):
                optimizer.zero_grad()
                loss_of(wrapped, batch(step, rank)).backward()
                optimizer.step()
        gathers, buckets = engine.param_comm.stats.calls, len(engine.buckets)
    diff = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters()))
    reduced, tensors = engine.comm.stats.calls, len(list(model.parameters()))
    return {"diff": diff, "gathers": gathers, "buckets": buckets, "reduced": reduced, "tensors": tensors}


def test_shard_groups_of_one_only_all_reduce_across_the_replicas(world):
    """``shard_size=1`` at W=2: each rank owns everything, so nothing is reduced or gathered inside its
    group; each bucket is all-reduced across the replicas once a step — bitwise equal to DDP + Adam."""
    for result in world(_replicas_only_program, 2):
        assert result["diff"] == 0.0 and result["gathers"] == 0, result
        # per step one all-reduce per bucket (no module buffers to broadcast); + the set-up broadcast, one per tensor
        assert result["reduced"] == 4 * result["buckets"] + result["tensors"], result


W3_CASES = [EngineCase("flat"), EngineCase("sorted_greedy", prefetch=False, accumulate=2, **P2P)]


def test_parity_with_ddp_at_three_ranks(world):
    for rank_results in world(_parity_cases, 3, W3_CASES):
        for case, result in zip(W3_CASES, rank_results):
            assert result["diff"] <= 1e-6, (case, result)


def _unused_and_frozen() -> nn.Module:
    model = make_model()
    model.append(nn.Linear(3, 3))  # registered last, never called: no gradient reaches it (bucket 0)
    model.forward = lambda x: nn.Sequential.forward(model[:-1], x)  # type: ignore[method-assign]
    model[0].weight.requires_grad_(False)  # frozen from the start
    return model


def _unused_frozen_program() -> list[dict[str, Any]]:
    return [_train_pair(case, _unused_and_frozen) for case in (EngineCase("sorted_greedy"), EngineCase(accumulate=2))]


def test_unused_and_frozen_parameters(world):
    for rank_results in world(_unused_frozen_program, 2):
        for result in rank_results:
            assert result["diff"] == 0.0 and result["losses_equal"], result


def _big_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(64, 64) for _ in range(12)))


def _held_program() -> dict[str, Any]:
    """12 equal layers, a bucket each: gradient bytes held at most Ψ/2 + two buckets (DDP: 2Ψ)."""
    rank = torch.distributed.get_rank()
    model = _big_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine = ShardedDataParallel(model, opt, bucket_cap_mb=64 * 65 * 4 / 2**20)
    before = engine.comm_stats.snapshot()
    for step in range(2):
        opt.zero_grad()
        engine(torch.randn(8, 64, generator=torch.Generator().manual_seed(step + 10 * rank))).pow(2).mean().backward()
        opt.step()
    engine.close()
    psi = sum(p.numel() * 4 for p in model.parameters())
    return {
        "peak": engine.peak_grad_bytes,
        "bound": engine.grad_hold_bound(),
        "psi": psi,
        "buckets": len(engine.buckets),
        "sent": engine.comm_stats.since(before).sent_bytes,
    }


def test_gradient_bytes_held_and_sent(world):
    for result in world(_held_program, 2):
        psi = result["psi"]
        assert result["buckets"] == 12
        assert result["bound"] == psi // 2 + 2 * psi // 12
        assert psi // 2 < result["peak"] <= result["bound"]
        # per step the reduce-scatter sends the peer's half, the all-gather this rank's half: Ψ (DDP's bytes)
        assert result["sent"] == 2 * psi


REDUCES = ("reduce_scatter", "all_reduce", "reduce_scatter_native")
EXCHANGES = ("p2p_all_gather", "broadcast", "all_gather")
#: every strategy x collective over Gloo, then the shared-memory ones (zero_lab.host_shm), last
PAIRS = [*itertools.product(REDUCES, EXCHANGES), ("shm_all_reduce", "shm_all_gather")]
PAIRS.append(("shm_reduce_scatter", "shm_all_gather"))


def _exit_program(repeats: int, close: bool) -> int:
    """Engines of every strategy x exchange collective, ``repeats`` times, each ending right after its
    last step() (prefetch: all-gathers still in flight): closed (waited) or left to the world's end."""
    engines = 0
    for repeat in range(repeats):
        for reduce, exchange in PAIRS:
            model = make_model(seed=repeat)
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            engine = ShardedDataParallel(model, opt, bucket_cap_mb=0.001, grad_reduce=reduce, exchange=exchange)
            for step in range(2):
                opt.zero_grad()
                loss_of(engine, batch(step, torch.distributed.get_rank())).backward()
                opt.step()
            assert engine.group.in_flight == len(engine.buckets)  # prefetch: the gathers wait for a forward
            if close or (repeat, (reduce, exchange)) != (repeats - 1, PAIRS[-1]):
                engine.close()
                assert engine.group.in_flight == 0
            engines += 1
    return engines


def test_nothing_in_flight_after_close(world):
    # ten rounds of every strategy x collective, each closed; then a world whose last engine is
    # left in flight when the rank returns (the world destroys the group): neither aborts
    assert world(_exit_program, 2, 10, True) == [110, 110]
    assert world(_exit_program, 2, 1, False) == [11, 11]
