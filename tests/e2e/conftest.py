"""Runs of the real ``python train.py`` made once per session and read by several modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.runs import run_once


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
