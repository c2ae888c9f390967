"""scripts/time_passes.py (zero_lab.bench.passes): the passes timed in a real world, beside the step
model's compute phase — the same formula the step model prices a step with."""

from __future__ import annotations

import math

import pytest
import torch

from tests.dist.worlds import run_ranks
from zero_lab.bench.check_model import SAMPLES
from zero_lab.bench.hardware import load_hardware
from zero_lab.bench.passes import main, predicted, time_passes
from zero_lab.bench.workloads import MODELS
from zero_lab.planner import specs_from_module
from zero_lab.step_model import STRATEGIES, predict_step


def test_every_rank_reports_the_slowest_ranks_passes() -> None:
    ranks = run_ranks(time_passes, 2, "tiny", 2)
    assert ranks[0] == ranks[1]  # the slowest rank's medians, on every rank
    assert all(0 < seconds < math.inf for seconds in ranks[0])  # slowest_median's (test_calibrate_world)


def test_the_table_prices_the_passes_as_the_step_model_does(capsys) -> None:
    (row,) = main(["--models", "tiny", "--world-sizes", "1", "--steps", "2"])
    hardware = load_hardware("gloo_local")
    with torch.device("meta"):
        specs = specs_from_module(MODELS["tiny"].build())
    step = predict_step(specs, STRATEGIES["ddp"], hardware, 1, SAMPLES["tiny"])
    assert row.predicted_forward_s == pytest.approx(step.phase("forward").seconds)
    assert row.predicted_both_s == pytest.approx(step.phase("forward").seconds + step.phase("backward").seconds)
    assert row.flops_only_s < row.predicted_both_s  # the weights' reads on top of the FLOPs
    assert row.forward_s > 0 and row.both_s > 0  # measured; which is longer is timing, not asserted
    # a crowded world: both the model's terms shared evenly (4 ranks on gloo_local's 2 cores)
    four = predicted("tiny", 4, hardware)
    assert four == pytest.approx(tuple(2 * v for v in predicted("tiny", 1, hardware)))
    assert "| tiny | 1 |" in capsys.readouterr().out
