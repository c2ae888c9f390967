"""The engine's features beyond the plain step, each against DDP + the same optimizer at W=2.

Sharded ``clip_grad_norm_`` (the total norm and the clipped training: bitwise with a
whole-parameter partitioner, 1e-6 with ``Flat``, whose parameters straddle ranks), for the 2-norm
and the inf-norm, with and without accumulation. All cases of a world run in one world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import OPTIMIZERS, accumulated_backward, make_model, max_diff
from zero_lab import ShardedDataParallel
from zero_lab.partition import Flat, SortedGreedy

PARTITIONERS = {"flat": Flat, "sorted_greedy": SortedGreedy}


@dataclass(frozen=True)
class ClipCase:
    partitioner: str = "flat"
    max_norm: float = 0.05  # below the model's gradient norm: every step clips
    norm_type: float = 2.0
    accumulate: int = 1
    optimizer: str = "adam"
    steps: int = 3


def _clip_pair(case: ClipCase) -> dict[str, Any]:
    """DDP + torch's clip and the engine + its clip, side by side on the same batches."""
    rank = torch.distributed.get_rank()
    cls, kwargs = OPTIMIZERS[case.optimizer]
    reference, model = make_model(), make_model()
    ddp = DDP(reference)
    plain = cls(reference.parameters(), **kwargs)
    opt = cls(model.parameters(), **kwargs)
    engine = ShardedDataParallel(model, opt, partitioner=PARTITIONERS[case.partitioner](), bucket_cap_mb=0.001)
    norms: dict[str, list[float]] = {"ddp": [], "engine": []}
    for step in range(case.steps):
        for name, wrapped, optimizer in (("ddp", ddp, plain), ("engine", engine, opt)):
            optimizer.zero_grad()
            accumulated_backward(wrapped, step, rank, case.accumulate)
            if name == "ddp":
                norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), case.max_norm, case.norm_type)
            else:
                norm = engine.clip_grad_norm_(case.max_norm, case.norm_type)
            norms[name].append(norm.item())
            optimizer.step()
    engine.close()
    return {"diff": max_diff(reference.parameters(), model.parameters()), "norms": norms}


CLIP_CASES = [
    ClipCase("sorted_greedy"),
    ClipCase("sorted_greedy", norm_type=float("inf"), max_norm=0.01),
    ClipCase("sorted_greedy", accumulate=2, optimizer="sgd"),
    ClipCase("sorted_greedy", max_norm=1e3),  # never clips
    ClipCase("flat"),
    ClipCase("flat", norm_type=float("inf"), max_norm=0.01),
    ClipCase("flat", accumulate=2, optimizer="sgd"),
]


def _clip_cases(cases: list[ClipCase]) -> list[dict[str, Any]]:
    return [_clip_pair(case) for case in cases]


def test_clip_grad_norm_matches_ddp_and_torch_clip(world):
    for rank_results in world(_clip_cases, 2, CLIP_CASES):
        for case, result in zip(CLIP_CASES, rank_results):
            ddp, engine = result["norms"]["ddp"], result["norms"]["engine"]
            if case.max_norm < 1:
                assert min(ddp) > case.max_norm, (case, ddp)  # the case does clip
            if case.partitioner == "sorted_greedy" or case.norm_type == float("inf"):
                assert engine == ddp and result["diff"] == 0.0, (case, result)
            else:
                assert max(abs(a - b) / b for a, b in zip(engine, ddp)) <= 1e-6, (case, result)
                assert result["diff"] <= 1e-6, (case, result)
