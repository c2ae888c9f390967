"""``python scripts/time_passes.py``: the step model's compute phase beside the forward and backward timed here.

For each model and world size, every rank of a fresh Gloo world runs the model's forward (under
``torch.no_grad``) and its forward + backward under ``DDP.no_sync()`` — DDP's wrapper, no
gradient reduction — at once, ``--steps`` times after a barrier each; a row is the slowest
rank's median, as a step waits for it. Beside it the step model's price
(:func:`zero_lab.step_model.compute_seconds` on a hardware profile, default ``gloo_local``) and,
for comparison, the FLOPs alone at the profile's matmul rate (the model before it read the
weights). Freed memory stays in the heap, as in the benchmark's timing phases::

    python scripts/time_passes.py                                    # linear768 tutorial-quick, W = 1 2 4
    python scripts/time_passes.py --models linear768 --world-sizes 1 --steps 10
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab.bench.calibrate import slowest_median
from zero_lab.bench.check_model import SAMPLES
from zero_lab.bench.hardware import load_hardware
from zero_lab.bench.host import keep_freed_memory
from zero_lab.bench.render import error_percent, markdown_table
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.bench.workloads import MODELS
from zero_lab.collective_cost import Hardware
from zero_lab.planner import specs_from_module
from zero_lab.runtime.spawn import run_world
from zero_lab.step_model import compute_seconds

__all__ = ["Passes", "format_passes", "main", "predicted", "time_passes"]


@dataclass(frozen=True)
class Passes:
    """One model at one world size: measured and predicted seconds of the forward and of forward + backward."""

    model: str
    world_size: int
    forward_s: float
    both_s: float
    predicted_forward_s: float
    predicted_both_s: float
    flops_only_s: float


def time_passes(model: str, steps: int) -> tuple[float, float]:
    """On every rank of a world: the slowest rank's median forward and forward + backward (``no_sync``)."""
    keep_freed_memory()
    torch.manual_seed(0)
    preset = MODELS[model]
    module = preset.build()
    ddp = DDP(module)
    x, y = preset.batch(0, dist.get_rank())

    def forward() -> None:
        with torch.no_grad():
            preset.loss(ddp(x), y)

    def both() -> None:
        for param in module.parameters():
            param.grad = None
        with ddp.no_sync():
            preset.loss(ddp(x), y).backward()

    return slowest_median(forward, steps, warmups=2), slowest_median(both, steps, warmups=2)


def predicted(model: str, world_size: int, hardware: Hardware) -> tuple[float, float, float]:
    """The step model's forward, forward + backward, and the FLOPs alone at ``matmul_flops`` (shared alike)."""
    with torch.device("meta"):
        specs = specs_from_module(MODELS[model].build())
    forward, backward = compute_seconds(specs, SAMPLES[model], hardware, world_size)
    flops = 6 * sum(s.numel for s in specs if s.trainable) * SAMPLES[model]
    return forward, forward + backward, flops / (hardware.matmul_flops * hardware.core_share(world_size))


def format_passes(rows: Sequence[Passes]) -> str:
    head = ["model", "W", "forward ms", "predicted", "fwd+bwd ms", "predicted", "error", "FLOPs alone ms"]
    body = [
        [
            r.model,
            str(r.world_size),
            f"{r.forward_s * 1e3:.2f}",
            f"{r.predicted_forward_s * 1e3:.2f}",
            f"{r.both_s * 1e3:.2f}",
            f"{r.predicted_both_s * 1e3:.2f}",
            error_percent(r.predicted_both_s, r.both_s),
            f"{r.flops_only_s * 1e3:.2f}",
        ]
        for r in rows
    ]
    return markdown_table(head, "lrrrrrrr", body)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--models", nargs="+", default=["linear768", "tutorial-quick"], choices=sorted(SAMPLES))
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=20, help="timed passes of each kind (after two warm-ups)")
    parser.add_argument("--hardware", default="gloo_local", help="a profile name or YAML path (default gloo_local)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Passes]:
    args = parse_args(argv)
    hardware = load_hardware(args.hardware)
    rows = []
    for model in args.models:
        for world in args.world_sizes:
            forward, both = run_world(time_passes, world, (model, args.steps))[0]
            rows.append(Passes(model, world, forward, both, *predicted(model, world, hardware)))
    print(f"`{command_line('scripts/time_passes.py', argv)}` — profile {hardware.name}\n")
    print(format_passes(rows))
    return rows
