"""Shared test plumbing: worlds of Gloo ranks from one preloaded forkserver.

The first world pays for the forkserver (≈ 2 s: torch, torch.distributed, torch._dynamo,
zero_lab and the rank programs imported once); every later world costs ≈ 0.1–0.3 s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import run_once
from zero_lab.runtime import launch

launch.preload("tests.rank_programs")


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0, stop_grace_s: float = 120.0
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` Gloo ranks; results by rank."""
    return launch.run_world(
        fn,
        world_size,
        args,
        start_method="forkserver",
        timeout_s=timeout_s,
        deadline_s=timeout_s + 30,
        stop_grace_s=stop_grace_s,
    )


@pytest.fixture(scope="session")
def world() -> Callable[..., list[Any]]:
    return run_ranks


def assert_close_lists(a: Sequence[Any], b: Sequence[Any], atol: float = 1e-6) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert abs(x - y) <= atol, (x, y)


@pytest.fixture(scope="session")
def single_rank_group() -> None:
    """An in-process world of one Gloo rank: enough to construct optimizers and check errors."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> Path:
    """``python train.py`` with no overrides but the run dir: ZeRO-Adam, 2 ranks, W&B offline."""
    return run_once(tmp_path_factory.getbasetemp(), "default")


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> Path:
    """A 2-job basic-launcher sweep, plain Adam vs ZeRO-Adam at W=2, W&B offline, checkpoints every 3 steps."""
    return run_once(
        tmp_path_factory.getbasetemp(), "sweep", "optim=adam,zero_adam", "steps=6", "checkpoint_every=3", multirun=True
    )
