"""DDP's own options (``dist.find_unused_parameters``, ``dist.static_graph``,
``dist.broadcast_buffers``) with every ZeRO mode, through the app's own build and step
(``build_training``, ``protocols.batch_stream/call_model/loss_of``), on a model with a dict
output, BatchNorm and a parameter its forward never uses (found by the meta probe and priced at
nothing from construction, as the app's loop does: ``RunPlan.never_reached``): the parameters equal those of DDP +
the plain optimizer with the same options. One 2-rank world runs every case."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from tests.preflight import compose_job
from zero_lab.app.check.rules import to_container
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.run.build import build_training, params_never_reached
from zero_lab.app.workloads.protocols import batch_stream, call_model, loss_of

MODES = {
    "sorted_greedy": [],
    "sorted_greedy_bucket_view": ["bucket_view=true"],
    "flat_bucket_view": ["partitioner=flat", "bucket_view=true"],
    "overlap_zero_step": ["overlap=true"],
    "overlap_interleaved": ["overlap=true", "overlap_hook=interleaved"],
    "overlap_ddp_bucket_sharded": ["overlap=true", "partitioner=ddp_bucket", "partitioner.shard_buckets=true"],
    "prefetch": ["partitioner=flat", "partitioner.bucket_cap_mb=0.001", "bucket_view=true", "prefetch=true"],
}
OPTIONS = {
    "find_unused": ["dist.find_unused_parameters=true"],
    "static_graph": ["dist.static_graph=true"],
    "no_broadcast_buffers": ["dist.find_unused_parameters=true", "dist.broadcast_buffers=false"],
}


class Net(nn.Module):
    """Linear -> BatchNorm -> ReLU -> Linear, a dict output, ``aux`` never used."""

    task = "regression"

    def __init__(self, in_dim: int, out_dim: int, width: int = 24):
        super().__init__()
        self.inp = nn.Linear(in_dim, width)
        self.norm = nn.BatchNorm1d(width)
        self.out = nn.Linear(width, out_dim)
        self.aux = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.out(torch.relu(self.norm(self.inp(x))))}


def config(overrides: list[str]) -> dict[str, Any]:
    cfg, _, _ = compose_job([*overrides, "dp=ddp", "model.in_dim=12", "model.out_dim=6", "logger=none"])
    container = to_container(cfg)
    container["model"] = {"_target_": f"{__name__}.Net", "in_dim": 12, "out_dim": 6}
    return container


def train(container: dict[str, Any], steps: int = 4) -> list[torch.Tensor]:
    cfg = OmegaConf.create(container)
    data = instantiate(cfg.data)
    unused = params_never_reached(RunPlan.of(cfg).never_reached)  # the job plan's answer, as the app's loop reads it
    training = build_training(cfg, torch.device("cpu"), without_grad=unused)
    if training.zero and not cfg.overlap:  # owners balanced over the parameters that get gradients
        assert unused == ["aux.weight", "aux.bias"]
        assert [s.gets_grad for s in training.optimizer.partition.specs if s.name.startswith("aux")] == [False] * 2
    batches = batch_stream(data, torch.distributed.get_rank(), torch.distributed.get_world_size(), 0)
    for _ in range(steps):
        inputs, targets = next(batches)
        training.optimizer.zero_grad(set_to_none=True)
        loss_of(call_model(training.ddp, inputs), targets, data, "logits").backward()
        training.optimizer.step()
    if training.zero:
        training.optimizer.wait_for_exchange()  # prefetch: the last step's exchange is still in flight
    return [p.detach().clone() for p in training.model.parameters()] + [b.clone() for b in training.model.buffers()]


def cases(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[float]:
    """Rank program: for each (ZeRO config, plain config), the largest parameter/buffer difference."""
    out = []
    for zero, plain in pairs:
        out.append(max((a.float() - b.float()).abs().max().item() for a, b in zip(train(zero), train(plain))))
    return out


@pytest.fixture(scope="module")
def differences(world) -> dict[str, float]:
    names, pairs = [], []
    for option, option_overrides in OPTIONS.items():
        plain = config(["optim=adam", *option_overrides])
        for mode, mode_overrides in MODES.items():
            names.append(f"{option}/{mode}")
            pairs.append((config([*mode_overrides, *option_overrides]), plain))
    return dict(zip(names, world(cases, 2, pairs)[0]))


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_ddp_option_with_zero_mode_matches_ddp_with_the_plain_optimizer(differences, option, mode):
    assert differences[f"{option}/{mode}"] < 1e-6
