"""Data whose steps are held slow until the test lets them go: the time-limit test's first attempt
must still be training when Slurm's signal comes, whatever the machine's speed.

``ZERO_LAB_TEST_GATE=<path>`` in the environment: while ``<path>`` does not exist, every batch waits
:data:`HELD_S` first (so ``steps`` steps take at least ``steps * HELD_S`` seconds); once it exists,
batches come at full speed. Without the variable it is :class:`~zero_lab.app.workloads.data.RegressionData`
itself. The batches are the same either way: the wait changes no number.
"""

from __future__ import annotations

import os
import time

import torch

from zero_lab.app.workloads.data import RegressionData

GATE = "ZERO_LAB_TEST_GATE"
HELD_S = 0.5


class GatedRegression(RegressionData):
    """:class:`RegressionData`, each batch held :data:`HELD_S` while the gate file is absent."""

    def shard(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gate = os.environ.get(GATE)
        if gate and not os.path.exists(gate):
            time.sleep(HELD_S)
        return super().shard(step, rank, world_size)
