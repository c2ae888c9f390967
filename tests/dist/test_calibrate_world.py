"""The calibration's world (zero_lab.bench.calibrate.measure_collectives): every op timed, and in a
world of more ranks than cores its per-rank compute rates, the same on every rank (the slowest's);
its timer (slowest_median), which time_passes shares, the slowest rank's on every rank."""

from __future__ import annotations

import time

import torch.distributed as dist
import yaml

from tests.dist.worlds import run_ranks
from zero_lab.bench.calibrate import ONE_WAY, OPS, Rate, measure_collectives, profile_from, slowest_median
from zero_lab.bench.hardware import hardware_from_dict


def test_a_crowded_world_measures_its_ops_and_its_per_rank_rates() -> None:
    # 2 ranks told the host has 1 core: crowded; Adam on the tiny model, one block (cheap)
    ranks = run_ranks(measure_collectives, 2, [2**16], 1, 1, 1, ("tiny",))
    assert ranks[0] == ranks[1]  # every time the slowest rank's, every rate the slowest rank's
    rows = ranks[0]
    assert {(r["op"], r["nbytes"]) for r in rows if "nbytes" in r} == {(op, 2**16) for op in (*OPS, ONE_WAY)}
    rates = {r["op"]: r["rate"] for r in rows if "rate" in r}
    assert set(rates) == {"matmul_flops", "memory_bandwidth"} and all(v > 0 for v in rates.values())
    compute = {"matmul_flops": Rate(8e10, (1.0,)), "memory_bandwidth": Rate(1.6e10, (1.0,))}
    hardware = hardware_from_dict(yaml.safe_load(yaml.safe_dump(profile_from(rows, compute, "test", 1))))
    assert set(hardware.crowded[2].collectives) == set(OPS)
    assert hardware.on_host(2).matmul_flops == float(f"{rates['matmul_flops']:.4g}")


def planted_delay(delay_s: float) -> float:
    """Rank 1 sleeps ``delay_s`` in every timed call; rank 0 does nothing."""
    return slowest_median(lambda: time.sleep(delay_s if dist.get_rank() == 1 else 0.0), 3)


def test_every_rank_reads_the_slowest_ranks_time() -> None:
    # which rank is slowest is chance on an idle host: plant one (a sleep is a floor, never a ceiling)
    assert all(seconds >= 0.05 for seconds in run_ranks(planted_delay, 2, 0.05))
