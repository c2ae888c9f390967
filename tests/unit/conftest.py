"""The unit layer runs in one process on one thread.

torch's intra-op pool would use every core; on a busy 2-core machine its threads spin waiting
for each other, and one small training loop (test_workloads' ResNet) took 15 s instead of
0.1 s. The ranks the app and the benchmarks start set one thread each for the same reason.

torch is imported by the fixture, not here: under ``-n 2`` this file is also loaded by xdist's
controller, which runs no test, and importing torch there held back the workers' start by 2 s.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def one_thread() -> None:
    import torch

    torch.set_num_threads(1)
