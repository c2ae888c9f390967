"""``exchange="auto"`` never stages a model-sized copy (issue 20): both candidates are timed
on a sample of at most ``TUNE_SAMPLE_BYTES``, the report says how large, and the first step
still ends with every replica whole and equal to a forced exchange's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.dist.training import batch, loss_of, make_model
from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab.collectives import COLLECTIVES


@pytest.mark.parametrize("partitioner", [None, "flat"], ids=["per_shard", "flat"])
def test_the_auto_trial_is_timed_on_a_bounded_sample(world, partitioner):
    for row in world(first_steps, 2, partitioner):
        assert row["sample_bytes"] == 512  # 64 fp32 elements per rank: the cap, not the model's bytes
        assert row["model_bytes"] > 4 * row["sample_bytes"]
        assert row["collective"] in COLLECTIVES
        assert set(row["timings_s"]) == set(COLLECTIVES) and all(t > 0 for t in row["timings_s"].values())
        assert row["max_diff"] == 0.0  # the same parameters as with exchange="broadcast" forced
        assert row["replicas_equal"]


# ---------------------------------------------------------------- rank programs
def first_steps(partitioner: str | None, steps: int = 3) -> dict[str, Any]:
    import zero_lab.exchange

    zero_lab.exchange.TUNE_SAMPLE_BYTES = 512
    params: dict[str, list[torch.Tensor]] = {}
    reports = {}
    for exchange in ("auto", "broadcast"):
        model = make_model()
        kwargs = {"partitioner": Flat()} if partitioner == "flat" else {}
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2, exchange=exchange, **kwargs)
        for step in range(steps):
            opt.zero_grad()
            loss_of(model, batch(step, 0)).backward()  # the same batch on every rank: no DDP needed
            opt.step()
        params[exchange] = [p.detach().clone() for p in model.parameters()]
        reports[exchange] = opt.exchange_report()
    flat = torch.cat([p.flatten() for p in params["auto"]])
    everyone = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    auto = reports["auto"]
    return {
        "sample_bytes": auto.sample_bytes,
        "model_bytes": flat.numel() * 4,
        "collective": auto.collective,
        "timings_s": auto.timings_s,
        "max_diff": max((a - b).abs().max().item() for a, b in zip(params["auto"], params["broadcast"])),
        "replicas_equal": all(torch.equal(everyone[0], other) for other in everyone),
    }


def test_auto_never_picks_a_deliberately_slow_collective_or_gradient_strategy(world):
    """A registered collective and a registered gradient strategy that sleep 30 ms per call on
    top of the real work: five fresh optimizers in a row, ``auto`` never picks either."""
    for rows in world(choose_with_slow_candidates, 2, 5):
        for row in rows:
            assert row["exchange"] != "slow_broadcast" and "slow_broadcast" in row["exchange_timings"]
            assert row["grad_reduce"] != "slow_reduce_scatter" and "slow_reduce_scatter" in row["grad_timings"]
            assert row["exchange_timings"]["slow_broadcast"] > row["exchange_timings"]["broadcast"]
            assert row["grad_timings"]["slow_reduce_scatter"] > row["grad_timings"]["reduce_scatter"]


def choose_with_slow_candidates(tries: int) -> list[dict[str, Any]]:
    import time

    from torch.nn.parallel import DistributedDataParallel as DDP

    from zero_lab import register_collective
    from zero_lab.collectives import Broadcast
    from zero_lab.grad_reduce import P2PReduceScatter, reduce_gradients, register_grad_reduce

    @register_collective
    class SlowBroadcast(Broadcast):
        name, label = "slow_broadcast", "exchange_slow_broadcast"

        def issue(self, comm, storage, bounds, op):  # type: ignore[no-untyped-def]
            time.sleep(0.03)
            return super().issue(comm, storage, bounds, op)

    @register_grad_reduce
    class SlowReduceScatter(P2PReduceScatter):
        name, label = "slow_reduce_scatter", "grad_slow_reduce_scatter"

        def issue(self, comm, segments, tag):  # type: ignore[no-untyped-def]
            time.sleep(0.03)
            return super().issue(comm, segments, tag)

    rows = []
    for attempt in range(tries):
        model = make_model()
        ddp = DDP(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2, exchange="auto")
        handle = reduce_gradients(ddp, opt, "auto")
        opt.zero_grad()
        loss_of(ddp, batch(attempt, dist.get_rank())).backward()
        opt.step()
        report = opt.exchange_report()
        rows.append(
            {
                "exchange": report.collective,
                "exchange_timings": report.timings_s,
                "grad_reduce": handle.strategy,
                "grad_timings": handle.timings_s,
            }
        )
    return rows
