"""Fixtures every layer may use. Layer-specific ones live in ``unit/``, ``dist/`` and ``e2e/``.

- ``tests/unit``: no processes (an in-process one-rank group at most) — ``make check``.
- ``tests/dist``: worlds of Gloo ranks from one preloaded forkserver (``tests/dist/worlds.py``).
- ``tests/e2e``: the real ``python train.py``, single runs and sweeps (``tests/e2e/runs.py``).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def single_rank_group() -> None:
    """An in-process world of one Gloo rank: enough to construct optimizers and check errors."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
