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


@pytest.mark.parametrize("partitioner", [None, "flat"], ids=["per_shard", "flat"])
def test_the_auto_trial_is_timed_on_a_bounded_sample(world, partitioner):
    for row in world(first_steps, 2, partitioner):
        assert row["sample_bytes"] == 512  # 64 fp32 elements per rank: the cap, not the model's bytes
        assert row["model_bytes"] > 4 * row["sample_bytes"]
        assert row["collective"] in ("broadcast", "all_gather")
        assert set(row["timings_s"]) == {"broadcast", "all_gather"} and all(t > 0 for t in row["timings_s"].values())
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
