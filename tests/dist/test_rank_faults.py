"""Failures inside the ranks' loop, told in the app's words (issue 30, item 5), through the
job's own path: the app's rank loop (``train_rank``) on a Gloo world, the world's choice of the
rank to blame, and the first line the job prints (``describe_failure``).

* a model that leaves a parameter unused only after a few steps: the parameters by name and
  ``dist.find_unused_parameters=true`` (torch's text pointed at its own argument and at indices);
* a rank whose data runs out early: that rank and the data option (was a bare StopIteration);
* a NaN loss on rank 1: the first line blames rank 1 (was "rank 0 failed … (rank 1: nan)").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from tests.preflight import compose_job
from zero_lab.app.check.rules import to_container
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.record.closing import describe_failure
from zero_lab.app.run.rank_loop import RunSpec, train_rank
from zero_lab.app.workloads.data import RegressionData
from zero_lab.runtime.spawn import RankFailure

HERE = "tests.dist.test_rank_faults"
SMALL = ["model.in_dim=8", "model.hidden=16", "model.out_dim=4", "model.depth=2", "data.global_batch=8"]


class LaterUnused(nn.Module):
    """Uses ``b`` in its first two forwards only (a branch that switches off: DDP's error comes at
    the forward after the first step that left ``b`` without a gradient)."""

    task = "regression"

    def __init__(self, in_dim: int, out_dim: int, **_: Any):
        super().__init__()
        self.a = nn.Linear(in_dim, out_dim)
        self.b = nn.Linear(out_dim, out_dim)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        hidden = self.a(x)
        return self.b(hidden) if self.calls <= 2 else hidden


class ShortOnRank1(RegressionData):
    """A stream sharded by rank (``batches``) that gives rank 1 only two batches."""

    shard = None  # type: ignore[assignment]  # the stream protocol, not the global-batch one

    def batches(self, rank: int, world_size: int, start_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = start_step
        while rank != 1 or step < 2:
            yield self._slice(self.global_batch_at(step), rank, world_size)
            step += 1


class NanOnRank1(RegressionData):
    """Rank 1's inputs are NaN from step 2 on; rank 0's stay finite."""

    def shard(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().shard(step, rank, world_size)
        return (torch.full_like(x, float("nan")), y) if rank == 1 and step >= 2 else (x, y)


def _spec(
    run_dir: Path, model: str | None = None, data: str | None = None, choice: str = "regression", **settings: Any
) -> RunSpec:
    cfg, choices, _ = compose_job(["logger=none", "steps=6", "optim=zero_adam", "dp=ddp", *SMALL])  # DDP's errors
    config = to_container(cfg) | settings
    if model:
        config["model"]["_target_"] = f"{HERE}.{model}"
    if data:
        config["data"]["_target_"] = f"{HERE}.{data}"
    plan = RunPlan.of(OmegaConf.create(config))
    return RunSpec(
        config,
        str(run_dir),
        OptimPlan.of(cfg.optim),
        tuple(plan.specs or ()),
        meta={"choices": {**choices, "data": choice}},
    )


def _first_line(world: Any, spec: RunSpec, run_dir: Path) -> tuple[RankFailure, str]:
    with pytest.raises(RankFailure) as caught:
        world(train_rank, 2, spec, timeout_s=60)
    return caught.value, describe_failure(caught.value, run_dir).splitlines()[0]


def test_a_parameter_unused_after_some_steps_is_named_with_the_apps_key(world, tmp_path):
    failure, line = _first_line(world, _spec(tmp_path, model="LaterUnused"), tmp_path)
    assert line == (
        "rank 0 failed: UnusedParameters: 2 parameter(s) (b.weight, b.bias) got no gradient in the backward before "
        "step 3, though they had one in earlier steps; DDP refuses that unless told to expect it: set "
        "dist.find_unused_parameters=true (or make the model use every parameter in every step)"
    )
    assert "Expected to have finished reduction" in failure.details  # torch's own text stays in the traceback file


def test_a_rank_whose_data_runs_out_early_is_named_with_the_data_option(world, tmp_path):
    failure, line = _first_line(world, _spec(tmp_path, data="ShortOnRank1", choice="short"), tmp_path)
    assert line == (
        f"rank 1 failed: DataExhausted: rank 1's data ran out at step 2 of 6: data=short ({HERE}.ShortOnRank1) yields "
        "no more batches for rank 1; every rank needs one batch per step: give it more data (or let its batches() "
        "cycle), or lower steps"
    )
    assert "StopIteration" not in failure.summary


def test_a_nan_loss_on_rank_1_blames_rank_1_first(world, tmp_path):
    failure, line = _first_line(world, _spec(tmp_path, data="NanOnRank1"), tmp_path)
    assert line.startswith("rank 1 failed: NonFiniteLoss: non-finite loss at step 2 (rank 1: nan); stopped")
    assert failure.rank == 1 and 0 in failure.others  # rank 0 stopped too, and is listed beside it


def test_a_nan_loss_names_the_checkpoint_to_go_back_to_or_that_none_was_written(world, tmp_path):
    """NaN at step 2 with ``checkpoint_every=4``: no checkpoint was written before it (said so, not that
    ``checkpoint_every`` was 0); the same run resumed from a finite run's step-2 checkpoint: that one is
    the last good checkpoint, though this run wrote none."""
    lower = ". Lower optim.lr or set optim.max_grad_norm"
    first = tmp_path / "first"
    _, line = _first_line(world, _spec(first, data="NanOnRank1", checkpoint_every=4), first)
    assert line.endswith(f"(rank 1: nan); stopped, no checkpoint was written before it{lower}"), line
    finite = tmp_path / "finite"
    world(train_rank, 2, _spec(finite, steps=2, checkpoint_every=2), timeout_s=60)
    resumed = tmp_path / "resumed"
    _, line = _first_line(world, _spec(resumed, data="NanOnRank1", resume=str(finite)), resumed)
    assert line.endswith(f"stopped, last good checkpoint: {finite}/checkpoints/step_00000002{lower}"), line
