"""Code written for torch's class, on a real world: a custom ``JoinHook`` that replays
gradients over ``opt._all_params`` (as torch's own Join test does), and torch's private
per-rank maps, which name the same owners as torch's at W=2."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

from tests.dist.training import make_model
from zero_lab import ZeroRedundancyOptimizer


def test_a_custom_join_hook_reading_all_params_trains_like_adam(world):
    for row in world(join_with_gradient_setter, 2):
        assert row["steps"] == 3
        assert row["max_diff"] == 0.0


def test_private_per_rank_maps_match_torchs_owners(world):
    for row in world(private_maps, 2):
        assert row["owners"] == row["torch_owners"]
        assert row["partition"] == row["torch_partition"]
        assert row["devices"] == row["torch_devices"]


# ---------------------------------------------------------------- rank programs
class _ReplayGrads(JoinHook):
    """After this rank joined: set the next recorded gradients on ``zero._all_params``."""

    def __init__(self, zero: Any, grads: list[list[torch.Tensor]]):
        self.zero, self.grads = zero, list(grads)

    def main_hook(self) -> None:
        for param, grad in zip(self.zero._all_params, self.grads.pop(0)):
            param.grad = grad.clone()


class _GradientSetter(Joinable):
    def __init__(self) -> None:
        super().__init__()

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _ReplayGrads(kwargs["zero_optim"], kwargs["grads"])

    @property
    def join_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def join_process_group(self) -> Any:
        return dist.group.WORLD


def join_with_gradient_setter() -> dict[str, Any]:
    """Rank r has 1 + 2r inputs; the gradients of every step (the same on all ranks) are
    replayed by the gradient setter on ranks that ran out, so ZeRO must end where plain
    Adam on the full sequence ends."""
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = 1 + 2 * (world - 1)
    gen = torch.Generator().manual_seed(7)
    model = make_model()
    shapes = [p.shape for p in model.parameters()]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(steps)]
    reference = make_model()
    adam = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for step in range(steps):
        for param, grad in zip(reference.parameters(), grads[step]):
            param.grad = grad.clone()
        adam.step()
    zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    mine = 1 + 2 * rank
    setter = _GradientSetter()
    with Join([setter, zero], zero_optim=zero, grads=grads[mine:]):
        for step in range(mine):
            Join.notify_join_context(setter)
            for param, grad in zip(model.parameters(), grads[step]):
                param.grad = grad.clone()
            zero.step()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    return {"steps": steps, "max_diff": diff}


def private_maps() -> dict[str, Any]:
    """torch's and zero_lab's classes over the same parameters: who owns what."""
    params = list(make_model().parameters())
    index = {id(p): i for i, p in enumerate(params)}
    theirs = TorchZero(params, torch.optim.Adam, parameters_as_bucket_view=True, lr=1e-3)
    ours = ZeroRedundancyOptimizer(params, torch.optim.Adam, lr=1e-3)

    def owners(opt: Any) -> list[int]:
        return [opt._param_to_rank[p] for p in params]

    def partition(opt: Any) -> list[list[list[int]]]:
        return [[sorted(index[id(p)] for p in g["params"]) for g in rank] for rank in opt._partition_parameters()]

    def devices(opt: Any) -> dict[str, list[list[int]]]:
        return {
            str(d): [sorted(index[id(p)] for p in r) for r in rs] for d, rs in opt._device_to_params_per_rank.items()
        }

    return {
        "owners": owners(ours),
        "torch_owners": owners(theirs),
        "partition": partition(ours),
        "torch_partition": partition(theirs),
        "devices": devices(ours),
        "torch_devices": devices(theirs),
    }
