"""Runs of the real ``python train.py`` made once per session and read by several modules.

The two are independent, so whichever fixture comes first makes both, together, once for all
xdist workers (:func:`tests.e2e.runs.runs_once` in :func:`tests.e2e.runs.session_base`); the DDP +
Adam references other modules compare with are made the same way (:data:`tests.e2e.runs.REFERENCES`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.runs import runs_once, session_base

#: ``python train.py`` with no overrides but the run dir: ZeRO-Adam, 2 ranks, W&B offline; and a
#: 2-job basic-launcher sweep, plain Adam vs ZeRO-Adam at W=2, W&B offline, checkpoints every 3 steps.
SHARED = {"default": ((), False), "sweep": (("optim=adam,zero_adam", "steps=6", "checkpoint_every=3"), True)}


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> Path:
    return runs_once(session_base(tmp_path_factory), SHARED)["default"]


@pytest.fixture(scope="session")
def sweep(tmp_path_factory) -> Path:
    return runs_once(session_base(tmp_path_factory), SHARED)["sweep"]
