"""Each strategy's iteration ÷ a reference's, paired step by step, from saved bench runs.

``scripts/bench.py`` prints the median of the per-step ratios. On a shared machine the other
processes' load only ever adds time, so beside that median this prints the per-step ratios'
minimum and the ratio of the two strategies' fastest iterations (the least disturbed figures),
and how many steps were paired::

    python scripts/bench_ratios.py docs/data/bench-pipeline-linear768.json --against ddp
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.summary import common_rounds


def ratios(run: dict, name: str, ref: str) -> dict[str, float] | None:
    """Per-step paired ratios of ``name`` to ``ref`` (their first common round): min, median, min ÷ min."""
    results = run["results"]
    common = common_rounds(results, name, ref)
    if not common:
        return None
    ours, theirs = results[name]["steps_by_round"][common[0]], results[ref]["steps_by_round"][common[0]]
    per_step = [a["iter_s"] / b["iter_s"] for a, b in zip(ours, theirs) if b["iter_s"] > 0]
    return {
        "steps": len(per_step),
        "min": min(per_step),
        "median": statistics.median(per_step),
        "fastest": min(a["iter_s"] for a in ours) / min(b["iter_s"] for b in theirs),
        "median_ms": 1e3 * statistics.median(a["iter_s"] for a in ours),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("paths", type=Path, nargs="+", help="JSON files written by scripts/bench.py")
    parser.add_argument("--against", default="ddp", help="the reference strategy (default ddp)")
    args = parser.parse_args()
    for path in args.paths:
        report = json.loads(path.read_text())
        load = report["machine"]["load_average"]
        print(f"\n{path} — `{report['command']}` (load average at start {load[0]:.1f})")
        for run in report["runs"]:
            print(f"\n{run['model']}, W={run['world_size']}, ÷ {args.against}, paired per step\n")
            print("| strategy | median iteration ms | per-step ratio: median | min | fastest ÷ fastest | steps |")
            print("|---|---:|---:|---:|---:|---:|")
            for name in run["results"]:
                row = None if name == args.against else ratios(run, name, args.against)
                if row is not None:
                    print(
                        f"| {name} | {row['median_ms']:.1f} | {row['median']:.3f} | {row['min']:.3f} | "
                        f"{row['fastest']:.3f} | {row['steps']} |"
                    )


if __name__ == "__main__":
    main()
