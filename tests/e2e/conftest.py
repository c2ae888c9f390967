"""Runs of the real ``python train.py`` made once per session and read by several modules.

The default run and the sweep are independent, so whichever fixture comes first makes both,
together, once for all xdist workers (:func:`tests.e2e.runs.runs_once` in
:func:`tests.e2e.runs.session_base`); the DDP + Adam references below are made once in the same way,
by the first module that compares with one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.runs import run_once, runs_once, session_base

#: ``python train.py`` with no overrides but the run dir: ZeRO-Adam, 2 ranks, W&B offline; and a
#: 2-job basic-launcher sweep, plain Adam vs ZeRO-Adam at W=2, W&B offline, checkpoints every 3 steps.
SHARED = {"default": ((), False), "sweep": (("optim=adam,zero_adam", "steps=6", "checkpoint_every=3"), True)}


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> Path:
    return runs_once(session_base(tmp_path_factory), SHARED)["default"]


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> Path:
    return runs_once(session_base(tmp_path_factory), SHARED)["sweep"]


@pytest.fixture(scope="session")
def adam_ddp_run(tmp_path_factory) -> Path:
    """``optim=adam dp=ddp``, 4 steps, no logger: DDP + Adam, what the engine (test_engine_app.py) and
    ZeRO-Adam split along DDP's buckets (test_ddp_bucket_app.py) train to bitwise."""
    return run_once(session_base(tmp_path_factory), "adam-ddp", "steps=4", "logger=none", "optim=adam", "dp=ddp")


@pytest.fixture(scope="session")
def clipped_adam_run(tmp_path_factory) -> Path:
    """``optim=adam optim.max_grad_norm=0.05``, 6 steps, no logger: DDP + Adam clipped on every step, what
    the engine (test_engine_resume.py) and flat ZeRO-Adam on DDP (test_app_precision.py) clip to."""
    base = session_base(tmp_path_factory)
    return run_once(base, "adam-clipped", "steps=6", "logger=none", "optim=adam", "optim.max_grad_norm=0.05")
