"""Worlds of Gloo ranks for the ``tests/dist`` layer, all forked from one preloaded forkserver.

The first world pays for the forkserver (≈ 2 s: torch, torch.distributed, torch._dynamo,
zero_lab and the shared training helpers imported once); every later world costs ≈ 0.1–0.3 s.
A rank program is a module-level function of the test module that spawns it (the
forkserver imports it by module path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zero_lab.runtime import spawn

spawn.preload("tests.dist.training")


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    stop_grace_s: float = 120.0,
    stall_timeout_s: float | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` Gloo ranks; results by rank."""
    return spawn.run_world(
        fn,
        world_size,
        args,
        start_method="forkserver",
        timeout_s=timeout_s,
        deadline_s=timeout_s + 30,
        stop_grace_s=stop_grace_s,
        stall_timeout_s=stall_timeout_s,
    )
