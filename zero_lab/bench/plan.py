"""Predict per-rank memory of ZeRO-1 at world sizes this machine cannot run.

Builds the model on the ``meta`` device (no memory), runs the real zero_lab partitioner
on its parameter sizes and prices each rank's shards with the optimizer's state layout
(probed from the real optimizer class); see :mod:`zero_lab.planner`::

    python scripts/plan.py --model lm --world-size 1024 --partitioner flat
    python scripts/plan.py --model gpt2-xl --world-size 8 64 1024 4096 --partitioner all
    python scripts/plan.py --model tutorial --world-size 2 --optimizer sgd --json plan.json

Prints, per world size, one row per strategy (plain DDP first): the bytes every rank
holds (parameters, gradients, DDP buckets — the same on all ranks) and the optimizer
state's max / mean / min over ranks, with the partition imbalance.

With ``--hardware`` (a profile of :mod:`zero_lab.bench.hardware`) it predicts the step instead:
time per phase, memory and bytes per link class per rank, for every strategy of
:data:`zero_lab.step_model.STRATEGIES` and every ``--shard-size`` (:mod:`zero_lab.bench.at_scale`)::

    python scripts/plan.py --hardware h100_ib --model tutorial gpt2-xl --world-size 8 64 512 1024 --shard-size 1 8

``--plot DIR`` also writes, per model, ``at_scale-<model>.png`` (step time and memory per rank
against W, one line per strategy and S: :func:`zero_lab.report.model_plots.plot_at_scale`) and
the printed tables as ``at_scale.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zero_lab.bench import at_scale
from zero_lab.bench.hardware import load_hardware, profile_names
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.bench.workloads import MODELS, PLAN_ONLY
from zero_lab.files import write_atomic
from zero_lab.partition import Flat, Partitioner, SortedGreedy
from zero_lab.planner import MemoryPlan, plan_memory, specs_from_module
from zero_lab.report.model_plots import plot_at_scale
from zero_lab.step_model import STRATEGIES

MIB = 2**20

PARTITIONERS: dict[str, Callable[[], Partitioner]] = {"sorted_greedy": SortedGreedy, "flat": Flat}

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
    "sgd": (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
    "adagrad": (torch.optim.Adagrad, {"lr": 1e-2}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 1e-3}),
}


def build_on_meta(name: str) -> nn.Module:
    """The named model with every tensor on the meta device (shapes only, no storage)."""
    build = PLAN_ONLY[name] if name in PLAN_ONLY else MODELS[name].build
    with torch.device("meta"):
        return build()


def plans_for(
    module: nn.Module,
    world_size: int,
    partitioners: Sequence[str],
    optimizer: str,
    dtype: torch.dtype,
    master_weights: bool = False,
) -> list[MemoryPlan]:
    """DDP + the optimizer, then ZeRO-1 with each partitioner, at ``world_size``.

    ``master_weights`` applies to the ZeRO rows (zero_lab keeps fp32 masters of owned
    low-precision shards); the DDP row is the plain optimizer on the parameters as they are.
    """
    optimizer_class, defaults = OPTIMIZERS[optimizer]
    specs = specs_from_module((name, p.to(dtype)) for name, p in module.named_parameters())
    ddp = plan_memory(specs, world_size, None, optimizer_class, **defaults)
    return [ddp] + [
        plan_memory(specs, world_size, PARTITIONERS[p](), optimizer_class, master_weights=master_weights, **defaults)
        for p in partitioners
    ]


def format_plans(plans: Sequence[MemoryPlan]) -> str:
    """One Markdown table for one world size: what every rank holds, and the state spread."""
    first = plans[0].ranks[0]
    lines = [
        f"W={plans[0].world_size}: every rank holds parameters {first.param_bytes / MIB:,.1f} MiB, "
        f"gradients {first.grad_bytes / MIB:,.1f} MiB, DDP buckets {first.ddp_buffer_bytes / MIB:,.1f} MiB",
        "",
        "| strategy | state max MiB | state mean MiB | state min MiB | fp32 masters max MiB | total max MiB "
        "| state ÷ DDP | imbalance |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ddp_state = plans[0].summary()["state_bytes"]["max"]
    for plan in plans:
        summary = plan.summary()
        state, total, masters = summary["state_bytes"], summary["total_bytes"], summary["master_bytes"]
        ratio = state["max"] / ddp_state if ddp_state else float("nan")
        lines.append(
            f"| {plan.strategy} | {state['max'] / MIB:,.3f} | {state['mean'] / MIB:,.3f} | {state['min'] / MIB:,.3f} "
            f"| {masters['max'] / MIB:,.1f} | {total['max'] / MIB:,.1f} | {ratio:.4f} | {plan.imbalance:.3f} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--model", nargs="+", default=["lm"], choices=sorted([*MODELS, *PLAN_ONLY]))
    parser.add_argument("--world-size", type=int, nargs="+", default=[2], help="one or more world sizes")
    parser.add_argument("--partitioner", default="all", choices=[*PARTITIONERS, "all"])
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZERS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--master-weights", action="store_true", help="ZeRO rows keep fp32 masters of bf16/fp16")
    parser.add_argument("--json", type=Path, help="also write every plan (per rank) as JSON here")
    step = parser.add_argument_group("step time (with --hardware)")
    step.add_argument(
        "--hardware", help=f"predict step time on a profile: {', '.join(profile_names())}, or a YAML path"
    )
    step.add_argument("--shard-size", type=int, nargs="+", default=[], help="S: shard within groups of S ranks")
    step.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    step.add_argument("--samples-per-rank", type=int, help="tokens (or rows) per rank per step; default per model")
    step.add_argument(
        "--plot", type=Path, metavar="DIR", help="also write at_scale-<model>.png per model and at_scale.md there"
    )
    args = parser.parse_args(argv)
    if args.plot and not args.hardware:
        parser.error("--plot draws the step model's rows: give --hardware too (e.g. --hardware h100_ib)")
    return args


def step_times(args: argparse.Namespace, command: str = "") -> list[dict[str, Any]]:
    """``--hardware``: the at-scale table and its crossings, per model (with ``--plot``: a figure
    each, and the tables under ``command``, the line that made them)."""
    hardware = load_hardware(args.hardware)
    dtype = getattr(torch, args.dtype)
    out, text = [], []
    for model in args.model:
        samples = args.samples_per_rank or at_scale.SAMPLES.get(model, 1)
        module = build_on_meta(model)
        numel = sum(p.numel() for p in module.parameters())
        rows = at_scale.rows_for(
            model, module, hardware, args.world_size, args.shard_size, args.strategies, samples, dtype
        )
        heading = f"model {model}: {numel:,} parameters ({args.dtype}), {samples} samples per rank, {hardware.name}"
        block = "\n\n".join(
            [
                heading,
                at_scale.format_rows(rows),
                "step time ms · memory GiB per rank (the fullest rank):",
                at_scale.format_summary(rows),
                "\n".join(f"- {line}" for line in at_scale.crossings(rows)),
            ]
        )
        print(block + "\n")
        text.append(block)
        if args.plot:
            title = (
                f"{model} ({numel / 1e6:,.0f} M parameters, {args.dtype}, {samples:,} samples per rank) "
                f"on {hardware.name}, modelled"
            )
            path = plot_at_scale([row.as_dict() for row in rows], args.plot / f"at_scale-{model}.png", title)
            print(f"figure: {path}")
        out += [row.as_dict() for row in rows]
    if args.plot:
        page = f"`{command}`\n\n" + "\n\n".join(text) + "\n"
        print(f"tables: {write_atomic(args.plot / 'at_scale.md', lambda f: f.write(page.encode('utf-8')))}")
    if args.json:
        args.json.write_text(json.dumps({"hardware": hardware.name, "rows": out}, indent=1))
        print(f"rows: {args.json}")
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.hardware:
        return step_times(args, command_line("scripts/plan.py", argv))
    dtype = getattr(torch, args.dtype)
    partitioners = list(PARTITIONERS) if args.partitioner == "all" else [args.partitioner]
    out = []
    for model in args.model:
        module = build_on_meta(model)
        numel = sum(p.numel() for p in module.parameters())
        print(f"model {model}: {numel:,} parameters ({args.dtype}), optimizer {args.optimizer}")
        for index, world_size in enumerate(args.world_size):
            plans = plans_for(module, world_size, partitioners, args.optimizer, dtype, args.master_weights)
            if index == 0:
                print(f"optimizer state per stepped tensor: {plans[0].state_rule}\n")
            print(format_plans(plans) + "\n")
            out += [plan.as_dict(per_rank=args.json is not None) | {"model": model} for plan in plans]
    if args.json:
        args.json.write_text(json.dumps({"models": args.model, "plans": out}, indent=1))
        print(f"per-rank plans: {args.json}")
    return out


if __name__ == "__main__":
    main()
