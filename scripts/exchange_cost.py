"""What the parameter exchange costs per partitioner on Gloo, with ``exchange="auto"``.

    python scripts/exchange_cost.py --model lm --world-size 2 --steps 15

Every rank builds one model copy and one ``ZeroRedundancyOptimizer`` (Adam) per setting:
sorted-greedy and flat, each with bucket views off and on. At its first step each
setting's ``auto`` times broadcast against all-gather and picks one (printed, with both
timings: the max over ranks). Then the settings step in turn, step by step, so machine
load falls on all of them alike, with the same gradients every step; each step's
exchange time is the optimizer's own meter (``comm_stats``: the time ``step()`` was
blocked in its collectives). Printed per setting: the median over steps of the slowest
rank's exchange, and the median of the per-step ratios to sorted-greedy without views.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

import torch

from zero_lab import Flat, SortedGreedy, ZeroRedundancyOptimizer
from zero_lab.bench.workloads import MODELS
from zero_lab.comm import Communicator
from zero_lab.runtime.spawn import run_world

SETTINGS = {
    "sorted_greedy": (SortedGreedy, False),
    "sorted_greedy + bucket view": (SortedGreedy, True),
    "flat": (Flat, False),
    "flat + bucket view": (Flat, True),
}


def measure(model_name: str, steps: int) -> dict[str, object]:
    """Rank program: per setting, its exchange report and each timed step's exchange seconds."""
    preset, comm = MODELS[model_name], Communicator()
    runs = {}
    for name, (partitioner, bucket_view) in SETTINGS.items():
        torch.manual_seed(0)
        model = preset.build()
        x, y = preset.batch(0, comm.rank)
        preset.loss(model(x), y).backward()
        opt = ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.Adam, partitioner=partitioner(), parameters_as_bucket_view=bucket_view
        )
        opt.step()  # exchange="auto" chooses here
        runs[name] = opt
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(steps):
        for name, opt in runs.items():
            comm.barrier()
            before = opt.comm_stats.snapshot()
            opt.step()
            seconds[name].append(opt.comm_stats.since(before).exposed_seconds)
    return {"seconds": seconds, "reports": {name: opt.exchange_report().as_dict() for name, opt in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lm", choices=sorted(MODELS))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    ranks = run_world(measure, args.world_size, (args.model, args.steps), timeout_s=600)
    slowest = {name: [max(r["seconds"][name][i] for r in ranks) for i in range(args.steps)] for name in SETTINGS}
    base = slowest["sorted_greedy"]
    print(f"model {args.model} ({MODELS[args.model].description}), W={args.world_size}, Gloo, {args.steps} steps")
    print("| setting | mode auto picked | auto timed: broadcast / all_gather | exchange ms, median | ÷ sorted_greedy |")
    print("|---|---|---:|---:|---:|")
    for name, times in slowest.items():
        report = ranks[0]["reports"][name]
        tuned = " / ".join(f"{1e3 * report['timings_s'][c]:.1f} ms" for c in ("broadcast", "all_gather"))
        ratio = statistics.median(t / b for t, b in zip(times, base))
        print(f"| {name} | {report['mode']} | {tuned} | {1e3 * statistics.median(times):.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
