"""``python scripts/bench.py``: zero_lab beside torch's ZeroRedundancyOptimizer, FairScale, FSDP2 and DDP.

One invocation runs every strategy on the same model, the same initial weights and the
same data, for each world size, prints the tables and the verdict on every target, and
saves the raw figures as JSON (``--report`` re-prints a saved run)::

    python scripts/bench.py --quick      # about 2 minutes on 2 CPU cores: 4 of the 20 layers, 8 timed steps,
                                         # the strategies the targets compare
    python scripts/bench.py              # full: 20×Linear(2000,2000) and the LM, W = 1, 2, 4
    python scripts/bench.py --collectives --models tutorial lm --world-sizes 2
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from zero_lab.bench.render import run_text, targets_text
from zero_lab.bench.run import Settings, check_collectives, default_out, machine, run_world_size, tabulate
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.bench.strategies import STRATEGIES
from zero_lab.bench.targets import evaluate, strategies_compared
from zero_lab.bench.workloads import MODELS

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    quick = "fewer layers and steps, W = 2 only, the strategies the targets compare (about 2 minutes)"
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--world-sizes", type=int, nargs="+", help="default: 2 (quick) or 1 2 4")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), help="default: tutorial lm (or -quick)")
    parser.add_argument(
        "--strategies", nargs="+", choices=list(STRATEGIES), help="default: all available (--quick: the compared ones)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per strategy")
    parser.add_argument("--steps", type=int, help="timed iterations per strategy (default 8 quick / 20)")
    parser.add_argument("--memory-budget", type=float, default=0.6, help="share of MemAvailable a round may use")
    parser.add_argument("--out", type=Path, help="JSON path (default outputs/bench/bench-<mode>-<time>.json)")
    parser.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per world")
    parser.add_argument("--report", type=Path, help="re-print the tables of a saved JSON instead of measuring")
    parser.add_argument("--collectives", action="store_true", help="only time Gloo's transports on the models' bytes")
    args = parser.parse_args(argv)
    args.world_sizes = args.world_sizes or ([2] if args.quick else [1, 2, 4])
    args.models = args.models or (["tutorial-quick", "lm-quick"] if args.quick else ["tutorial", "lm"])
    args.steps = args.steps or (8 if args.quick else 20)
    return args


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    os.replace(temporary, path)


def rerender(path: Path) -> dict[str, Any]:
    """Print the tables and targets of a saved run again, recomputed from its raw figures."""
    report = json.loads(path.read_text())
    print(f"$ {report['command']}   (re-rendered from {path})")
    report["runs"] = [tabulate(run) for run in report["runs"]]
    for run in report["runs"]:
        print("\n" + run_text(run))
    report["targets"] = evaluate(report["runs"], list(report["strategies"]))
    print("\n" + targets_text(report["targets"]))
    return report


def _collectives(args: argparse.Namespace) -> dict[str, Any]:
    rows = check_collectives(args.models, args.world_sizes, args.steps, args.start_method)
    print("| model | W | MiB | all_gather_into_tensor ms | one broadcast per rank ms | one broadcast per tensor ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        cells = " | ".join(f"{v:.1f}" for v in row["ms"].values())
        print(f"| {row['model']} ({row['tensors']} tensors) | {row['world_size']} | {row['mib']:.0f} | {cells} |")
    return {"collectives": rows}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report:
        return rerender(args.report)
    if args.collectives:
        return _collectives(args)
    info = machine()
    absent = {"fairscale_oss"} if not info["fairscale_ok"] else set()
    absent |= {"deepspeed_z1", "deepspeed_z2"} if not info["deepspeed_ok"] else set()
    available = [n for n in STRATEGIES if n not in absent]
    missing = sorted(set(args.strategies or ()) & absent)
    if missing:
        peers = {"fairscale": info["fairscale"], "deepspeed": info["deepspeed"]}
        why = "; ".join(f"{name}: {peers[name.split('_')[0]]}" for name in missing)
        raise SystemExit(f"--strategies {' '.join(missing)}: the optional peer is absent here ({why})")
    strategies = args.strategies or [n for n in available if not args.quick or n in strategies_compared()]
    settings = Settings(
        tuple(args.models),
        tuple(args.world_sizes),
        tuple(strategies),
        args.warmup,
        args.steps,
        args.memory_budget,
        args.start_method,
        args.timeout,
    )
    command = command_line("scripts/bench.py", argv)
    print(
        f"$ {command}\n# torch {info['torch']}, {info['cpu_count']} CPUs (load {info['load_average'][0]:.1f}), "
        f"Gloo, 1 thread per rank; FairScale: {info['fairscale']}; DeepSpeed: {info['deepspeed']}",
        flush=True,
    )
    runs = []
    for world_size in settings.world_sizes:
        for run in run_world_size(settings, world_size):
            runs.append(run)
            print("\n" + run_text(run), flush=True)
    targets = evaluate(runs, strategies)
    print("\n" + targets_text(targets))
    report = {
        "command": command,
        "mode": "quick" if args.quick else "full",
        "machine": info,
        "settings": asdict(settings),
        "strategies": {n: STRATEGIES[n].label for n in strategies},
        "runs": runs,
        "targets": targets,
    }
    out = args.out or default_out(Path.cwd(), report["mode"])
    _write_json(out, report)
    print(f"\nraw figures: {out}")
    return report
