"""Turn a run dir or a whole sweep dir into a table, PNG plots and one offline HTML page.

    python scripts/report.py outputs/multirun/2025-01-01/12-00-00          # -> <dir>/report/
    python scripts/report.py outputs/2025-01-01/12-00-00 --out /tmp/report

Reads only the run dirs' ``summary.json`` and ``metrics.jsonl`` (no network, no W&B),
finding every run below the given dir. Writes:

* ``report.md``        one row per run: strategy, world size, optimizer-state bytes per
                       rank, peak memory, step and exchange time, bytes exchanged, loss;
* ``memory.png``       optimizer-state memory per rank vs world size, one line per strategy
                       (the max over ranks; every rank's value as a dot);
* ``time.png``         median step time and exchange time per strategy and world size;
* ``loss.png``         every run's loss curve, overlaid;
* ``report.html``      the table and the three plots embedded (base64), self-contained.

Medians skip each run's first step (one-off allocation costs).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the headless backend

MIB = 1024 * 1024


@dataclass
class Run:
    """What the report needs from one run dir."""

    path: Path
    strategy: str
    world_size: int
    losses: list[float]
    state_bytes: list[float]  # per rank
    peak_bytes: list[float]  # per rank
    step_ms: float
    exchange_ms: float
    exchange_kib: float
    samples_per_s: float
    final_loss: float
    per_rank_step_ms: list[float] = field(default_factory=list)


def strategy_of(summary: dict[str, Any]) -> str:
    """``zero_adam/flat+buckets``-style label from the run's group choices and switches."""
    choices = summary.get("choices") or {}
    label = str(choices.get("optim", "zero" if summary.get("zero") else "plain"))
    if summary.get("zero"):
        label += f"/{choices.get('partitioner', '?')}"
        label += "+buckets" if summary.get("bucket_view") else ""
        label += "+overlap" if summary.get("overlap") else ""
    return label


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def load_run(path: Path) -> Run:
    summary = json.loads((path / "summary.json").read_text())
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = rows[1:] or rows
    world = int(summary["world_size"])
    last = rows[-1] if rows else {}

    def per_rank(prefix: str) -> list[float]:
        return [float(last.get(f"{prefix}/rank{r}") or 0.0) for r in range(world)]

    return Run(
        path=path,
        strategy=strategy_of(summary),
        world_size=world,
        losses=list(summary["losses"]),
        state_bytes=per_rank("memory/optim_state_bytes"),
        peak_bytes=per_rank("memory/peak_bytes"),
        step_ms=1e3 * _median([r["time/step_s/max"] for r in timed]),
        exchange_ms=1e3 * _median([r["time/exchange_s/max"] for r in timed]),
        exchange_kib=_median([r["comm/exchange_bytes/max"] for r in timed]) / 1024,
        samples_per_s=_median([r["train/samples_per_s"] for r in timed]),
        final_loss=float(summary["final_loss"]),
        per_rank_step_ms=[1e3 * _median([r[f"time/step_s/rank{k}"] for r in timed]) for k in range(world)],
    )


def find_runs(root: Path) -> list[Run]:
    """Every run below ``root`` (a run dir is one holding summary.json and metrics.jsonl)."""
    dirs = sorted({p.parent for p in root.rglob("summary.json") if (p.parent / "metrics.jsonl").exists()})
    runs = [load_run(d) for d in dirs]
    return sorted(runs, key=lambda r: (r.strategy, r.world_size, str(r.path)))


# ----------------------------------------------------------------------------- table
COLUMNS = (
    "strategy",
    "W",
    "optim state / rank (MiB, max)",
    "state vs W=1 same strategy",
    "peak mem / rank (MiB, max)",
    "step (ms)",
    "exchange (ms)",
    "exchanged / step (KiB)",
    "samples/s",
    "final loss",
    "run",
)


def table_rows(runs: list[Run], root: Path) -> list[list[str]]:
    baseline = {r.strategy: max(r.state_bytes) for r in runs if r.world_size == 1}
    rows = []
    for run in runs:
        base = baseline.get(run.strategy)
        ratio = f"{max(run.state_bytes) / base:.3f}" if base else "–"
        rows.append(
            [
                run.strategy,
                str(run.world_size),
                f"{max(run.state_bytes) / MIB:.3f}",
                ratio,
                f"{max(run.peak_bytes) / MIB:.0f}",
                f"{run.step_ms:.2f}",
                f"{run.exchange_ms:.2f}",
                f"{run.exchange_kib:.1f}",
                f"{run.samples_per_s:.0f}",
                f"{run.final_loss:.6g}",
                str(run.path.relative_to(root)) if run.path != root else ".",
            ]
        )
    return rows


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ----------------------------------------------------------------------------- plots
def by_strategy(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.strategy, []).append(run)
    return {k: sorted(v, key=lambda r: r.world_size) for k, v in sorted(groups.items())}


def plot_memory(runs: list[Run], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for strategy, group in by_strategy(runs).items():
        worlds = [r.world_size for r in group]
        line = ax.plot(worlds, [max(r.state_bytes) / MIB for r in group], marker="o", label=strategy)[0]
        for run in group:
            ax.scatter([run.world_size] * len(run.state_bytes), [b / MIB for b in run.state_bytes],
                       color=line.get_color(), s=12, alpha=0.5)  # fmt: skip
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("optimizer state per rank (MiB)")
    ax.set_title("Optimizer-state memory per rank (line: max over ranks; dots: each rank)")
    ax.set_xticks(sorted({r.world_size for r in runs}))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time(runs: list[Run], path: Path) -> None:
    """Bars grouped by world size, one colour per strategy; the hatched inner bar is the
    part of the step spent in the parameter exchange."""
    groups = by_strategy(runs)
    worlds = sorted({r.world_size for r in runs})
    width = 0.8 / max(1, len(groups))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(worlds) + 3), 4.5))
    for index, (strategy, group) in enumerate(groups.items()):
        xs = [worlds.index(r.world_size) - 0.4 + width * (index + 0.5) for r in group]
        ax.bar(xs, [r.step_ms for r in group], width=width * 0.95, label=strategy)
        ax.bar(xs, [r.exchange_ms for r in group], width=width * 0.95, color="none", edgecolor="black", hatch="///")
    ax.bar([0], [0], color="none", hatch="///", edgecolor="black", label="of which: parameter exchange")
    ax.set_xticks(range(len(worlds)), [f"W={w}" for w in worlds])
    ax.set_ylabel("median time per step (ms, slowest rank)")
    ax.set_title("Step time (bars) and parameter-exchange time (hatched) by strategy")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss(runs: list[Run], path: Path) -> None:
    """Overlaid loss curves; wide-to-thin lines so identical trajectories stay visible."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ("-", "--", "-.", ":")
    for index, run in enumerate(runs):
        ax.plot(range(len(run.losses)), run.losses, label=f"{run.strategy} W={run.world_size}",
                linestyle=styles[index % len(styles)], linewidth=max(1.0, 4.0 - 0.5 * index), alpha=0.85)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_title("Loss curves (overlapping lines = the same trajectory)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOTS = {"memory.png": plot_memory, "time.png": plot_time, "loss.png": plot_loss}


def html_page(title: str, rows: list[list[str]], out: Path) -> str:
    images = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out / name).read_bytes()).decode()}"></figure>'
        for name in PLOTS
    )
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}"
        "figure{display:inline-block;margin:1em 1em 0 0}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>zero_lab report</h1><p>{html.escape(title)}</p>"
        f"{html_table(rows)}{images}</body></html>\n"
    )


def write_report(root: Path, out: Path) -> list[Run]:
    runs = find_runs(root)
    if not runs:
        raise SystemExit(f"report: no runs under {root} (a run dir holds summary.json and metrics.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(runs, root)
    (out / "report.md").write_text(f"# zero_lab report: {root}\n\n" + markdown_table(rows), encoding="utf-8")
    for name, plot in PLOTS.items():
        plot(runs, out / name)
    (out / "report.html").write_text(html_page(str(root), rows, out), encoding="utf-8")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", type=Path, help="a run dir or a sweep dir")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: <path>/report)")
    args = parser.parse_args(argv)
    root = args.path.resolve()
    out = args.out or root / "report"
    runs = write_report(root, out)
    print((out / "report.md").read_text())
    print(f"report: {len(runs)} run(s); wrote {out}/report.md, {', '.join(PLOTS)}, report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
