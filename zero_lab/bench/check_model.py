"""``python scripts/check_model.py``: the step model's predictions beside runs on this machine.

For every model, world size and strategy it runs the benchmark library's worlds
(:func:`zero_lab.bench.run.run_world_size`: a memory world whose one profiled iteration counts
every collective's bytes — DDP's all-reduce, zero_lab's gradient hook and exchange alike — then
a timing world that steps the strategies side by side) and prices the same step with
:func:`zero_lab.step_model.predict_step` on a hardware profile (default ``gloo_local``, this
machine's Gloo as ``scripts/calibrate.py`` fitted it) and
:func:`zero_lab.step_model.communicator_bytes`. Prints (and writes, ``--out``) a Markdown table:
predicted and measured step time (the slowest rank's median iteration) and bytes per step (rank
0's, the Communicator's convention), with the errors — the issue's bars are ±20 % for time and
±2 % for bytes::

    python scripts/check_model.py                                     # W = 1 2 4, both models, 20 steps
    python scripts/check_model.py --world-sizes 2 --steps 3 --warmup 1 --models linear768

Times depend on the load: the header carries the load average, and a figure taken with other
jobs running is "under load". Bytes do not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zero_lab.bench.hardware import load_hardware, profile_names
from zero_lab.bench.run import Settings, run_world_size
from zero_lab.bench.workloads import MODELS
from zero_lab.collective_cost import Hardware
from zero_lab.files import write_atomic
from zero_lab.partition import Flat, SortedGreedy
from zero_lab.planner import specs_from_module
from zero_lab.step_model import STRATEGIES as AT_SCALE
from zero_lab.step_model import ModeledStrategy, communicator_bytes, predict_step

__all__ = ["CHECKED", "SAMPLES", "Check", "checks_for", "format_checks", "main"]

#: Rows each benchmark model's forward sees per step (its ``batch``): the step model's samples.
SAMPLES = {"tutorial": 20, "tutorial-quick": 20, "linear768": 16, "tiny": 4}

#: The benchmark strategies checked, each as the step model prices it on Gloo. ``zl_sg_bv``'s
#: exchange is ``auto``: its prediction takes the collective the run chose (its report).
CHECKED: dict[str, ModeledStrategy] = {
    "ddp": AT_SCALE["ddp"],
    "zl_flat_bv_bc": ModeledStrategy("zl_flat_bv_bc", "flat, broadcast", Flat, exchange="broadcast"),
    "zl_flat_bv_ag": ModeledStrategy("zl_flat_bv_ag", "flat, all_gather", Flat, exchange="all_gather"),
    "zl_sg_bv": ModeledStrategy("zl_sg_bv", "sorted_greedy, bucket view, auto", SortedGreedy, exchange="broadcast"),
    "zl_gr_rs_bc": ModeledStrategy(
        "zl_gr_rs_bc", "flat, p2p reduce-scatter, broadcast", Flat, grad_reduce="reduce_scatter", exchange="broadcast"
    ),
}


@dataclass(frozen=True)
class Check:
    """One (model, W, strategy): predicted and measured seconds and bytes per step."""

    model: str
    world_size: int
    strategy: str
    predicted_s: float
    measured_s: float | None
    predicted_bytes: int
    measured_bytes: int | None
    exchange: str

    @staticmethod
    def error(predicted: float, measured: float | None) -> float | None:
        return None if not measured else (predicted - measured) / measured


def _as_run(strategy: ModeledStrategy, report: dict[str, Any] | None) -> ModeledStrategy:
    """``strategy`` with the exchange collective the run reports (``exchange="auto"`` decides per world)."""
    collective = (report or {}).get("collective")
    if strategy.partitioner is None or collective not in ("broadcast", "all_gather"):
        return strategy
    return ModeledStrategy(strategy.name, strategy.label, strategy.partitioner, strategy.grad_reduce, collective)


def checks_for(run: dict[str, Any], hardware: Hardware) -> list[Check]:
    """Predicted beside measured for one benchmark run (one model at one world size)."""
    with torch.device("meta"):
        specs = specs_from_module(MODELS[run["model"]].build())
    world, out = run["world_size"], []
    for name, result in run["results"].items():
        if name not in CHECKED:
            continue
        strategy = _as_run(CHECKED[name], result.get("report"))
        prediction = predict_step(specs, strategy, hardware, world, SAMPLES[run["model"]])
        predicted_bytes = sum(payload for payload, _ in communicator_bytes(specs, strategy, world, 0).values())
        steps = result.get("steps") or []
        measured_s = statistics.median(s["iter_s"] for s in steps) if steps else None
        counted = result.get("collectives") or {}
        measured_bytes = sum(counted.get(kind, {}).get("bytes", 0) for kind in ("grads", "params")) if counted else None
        seconds = (prediction.seconds, measured_s)
        out.append(Check(run["model"], world, name, *seconds, predicted_bytes, measured_bytes, strategy.exchange))
    return out


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f} %"


def format_checks(checks: Sequence[Check]) -> str:
    """The Markdown table of docs/benchmarks.md."""
    lines = [
        "| model | W | strategy | exchange | predicted ms | measured ms | time error | predicted MiB | measured MiB "
        "| bytes error |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        measured = "—" if c.measured_s is None else f"{c.measured_s * 1e3:,.1f}"
        counted = "—" if c.measured_bytes is None else f"{c.measured_bytes / 2**20:,.3f}"
        lines.append(
            f"| {c.model} | {c.world_size} | {c.strategy} | {c.exchange} | {c.predicted_s * 1e3:,.1f} | {measured} "
            f"| {_percent(Check.error(c.predicted_s, c.measured_s))} | {c.predicted_bytes / 2**20:,.3f} | {counted} "
            f"| {_percent(Check.error(c.predicted_bytes, c.measured_bytes))} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--hardware", default="gloo_local", help=f"a profile ({', '.join(profile_names())}) or path")
    parser.add_argument("--models", nargs="+", default=["tutorial-quick", "linear768"], choices=sorted(SAMPLES))
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=list(CHECKED), choices=list(CHECKED))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", help="also write the table (Markdown) here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Check]:
    args = parse_args(argv)
    hardware = load_hardware(args.hardware)
    command = "python scripts/check_model.py " + " ".join(sys.argv[1:] if argv is None else argv)
    settings = Settings(tuple(args.models), (), tuple(args.strategies), args.warmup, args.steps)
    checks = []
    for world in args.world_sizes:
        for run in run_world_size(settings, world):
            checks += checks_for(run, hardware)
    load = os.getloadavg()[0]
    header = f"`{command}` — profile {hardware.name}; load average {load:.1f} at the end on {os.cpu_count()} cores"
    text = header + "\n\n" + format_checks(checks) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, lambda f: f.write(text.encode("utf-8")))
    return checks
