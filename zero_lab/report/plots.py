"""The report's three PNGs, each readable on its own (title, axes with units, legend).

* :func:`plot_memory` — optimizer state per rank vs world size: one coloured line per series
  (the runs' labels without the world size) through the fullest rank, every rank as a marked
  point (nudged sideways per series so equal values stay visible), and the ideal
  ``DDP state / W`` curve for each DDP baseline, black and dotted: no series line is ever
  black or dotted, so the title's key (:data:`MEMORY_TITLE`) names each line drawn.
* :func:`plot_time` — one stacked horizontal bar per run: median compute (step − exchange)
  and median parameter exchange, whiskers from the 10th to the 90th percentile of each.
* :func:`plot_loss` — every run's loss per (integer) step; runs whose curves coincide are
  drawn in different styles and widths, and the legend says which one they repeat.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the report is written, never shown
import matplotlib.pyplot as plt
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from zero_lab.app.record.catalogue import EXCHANGE_S, OPTIM_STATE_BYTES, STEP_S
from zero_lab.report.runs import WORLD_KEY, Run, percentile
from zero_lab.report.table import byte_unit, ddp_baseline

__all__ = ["IDEAL_STYLE", "MEMORY_TITLE", "PLOTS", "memory_figure", "plot_loss", "plot_memory", "plot_time"]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
_STYLES = ("-", "--", "-.", ":")
#: The memory plot's series lines: never dotted, so only the ideal curve is.
_SERIES_STYLES = ("-", "--", "-.")
#: The ideal ``DDP / W`` curve: the memory plot's only black line and only dotted one.
IDEAL_STYLE = {"color": "black", "linestyle": ":"}
MEMORY_TITLE = (
    "Optimizer state per rank vs world size\n"
    "(a marker per rank; coloured line: fullest rank of a series; black dotted: ideal DDP / W)"
)
_DPI = 110


def _series(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.series, []).append(run)
    return {name: sorted(group, key=lambda r: r.world_size) for name, group in groups.items()}


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def plot_memory(runs: list[Run], path: Path) -> None:
    _save(memory_figure(runs), path)


def memory_figure(runs: list[Run]) -> plt.Figure:
    """The memory plot, drawn (:func:`plot_memory` saves it)."""
    states = [run.per_rank(OPTIM_STATE_BYTES.name) or [0.0] for run in runs]
    div, unit = byte_unit(max(max(s) for s in states))
    worlds = sorted({run.world_size for run in runs})
    span = (worlds[-1] - worlds[0]) or 1
    groups = _series(runs)
    nudge = 0.06 * span / max(1, len(groups))  # series side by side, so equal values stay visible
    fig, ax = plt.subplots(figsize=(10, 5))
    for index, (name, group) in enumerate(groups.items()):
        offset = (index - (len(groups) - 1) / 2) * nudge
        marker = _MARKERS[index % len(_MARKERS)]
        maxima = [max(r.per_rank(OPTIM_STATE_BYTES.name) or [0.0]) / div for r in group]
        line = ax.plot(
            [r.world_size + offset for r in group],
            maxima,
            linestyle=_SERIES_STYLES[index % len(_SERIES_STYLES)],
            linewidth=1.8,
            color=_series_color(index),
        )[0]
        style = {"color": line.get_color(), "linestyle": line.get_linestyle(), "markeredgecolor": "black"}
        ax.plot([], [], marker=marker, markersize=8, label=name, **style)  # the legend's entry: line + marker
        for run in group:
            ranks = [b / div for b in run.per_rank(OPTIM_STATE_BYTES.name) or []]
            spread = nudge * 0.6 / max(1, len(ranks))  # every rank its own point, side by side
            ax.scatter(
                [run.world_size + offset + (r - (len(ranks) - 1) / 2) * spread for r in range(len(ranks))],
                ranks,
                s=64,
                marker=marker,
                color=line.get_color(),
                edgecolors="black",
                linewidths=0.8,
                alpha=0.85,
                zorder=3,
            )
    _ideal_lines(ax, runs, worlds, div, unit)
    ax.set_xlabel("world size W (ranks)")
    ax.set_ylabel(f"optimizer state per rank ({unit})")
    ax.set_title(MEMORY_TITLE)
    ax.set_xticks(worlds)
    if len(worlds) == 1:
        ax.set_xlim(worlds[0] - 0.5, worlds[0] + 0.5)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def _series_color(index: int) -> str:
    """The default colour cycle without its grey (C7): black and grey stay the ideal's."""
    colors = [f"C{k}" for k in range(10) if k != 7]
    return colors[index % len(colors)]


def _ideal_lines(ax: plt.Axes, runs: list[Run], worlds: list[int], div: float, unit: str) -> None:
    """``DDP state / W`` at the measured world sizes only (a point each, dotted between them:
    a world size nobody ran is no claim), once per distinct DDP baseline."""
    baselines = sorted({b.state_bytes for run in runs if (b := ddp_baseline(run, runs)) is not None})
    for value in baselines:
        ax.plot(
            worlds,
            [value / div / w for w in worlds],
            **IDEAL_STYLE,
            marker="_",
            markersize=14,
            linewidth=1.3,
            label=f"ideal: DDP / W (DDP = {value / div:.3g} {unit})",
        )


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, median − p10, p90 − median) in ms."""
    if not values:
        return 0.0, 0.0, 0.0
    mid = statistics.median(values)
    return 1e3 * mid, 1e3 * (mid - percentile(values, 0.1)), 1e3 * (percentile(values, 0.9) - mid)


def plot_time(runs: list[Run], path: Path) -> None:
    """Horizontal bars, one row per run in the table's order: long labels stay readable at any count."""
    fig, ax = plt.subplots(figsize=(10, max(3.2, 0.55 * len(runs) + 1.8)))
    ys = list(range(len(runs)))
    for y, run in zip(ys, runs):
        steps, exchanges = run.per_step(STEP_S.at("max")), run.per_step(EXCHANGE_S.at("max"))
        exchanges = exchanges or [0.0] * len(steps)
        compute = [s - e for s, e in zip(steps, exchanges)]
        ex_mid, ex_low, ex_high = _spread(exchanges)
        co_mid, co_low, co_high = _spread(compute)
        ax.barh(y, ex_mid, height=0.6, color="tab:orange", edgecolor="black", hatch="//")
        ax.barh(y, co_mid, height=0.6, left=ex_mid, color="tab:blue", edgecolor="black")
        ax.errorbar(ex_mid, y - 0.12, xerr=[[ex_low], [ex_high]], color="black", capsize=3, linewidth=1)
        ax.errorbar(ex_mid + co_mid, y + 0.12, xerr=[[co_low], [co_high]], color="black", capsize=3, linewidth=1)
    handles = [
        Patch(facecolor="tab:blue", edgecolor="black", label="compute (step − exchange)"),
        Patch(facecolor="tab:orange", edgecolor="black", hatch="//", label="parameter exchange"),
    ]
    names = [run.label if WORLD_KEY in run.label else f"{run.label} · W={run.world_size}" for run in runs]
    ax.set_yticks(ys, [_wrap(name, 40) for name in names], fontsize=8)
    ax.invert_yaxis()  # the first run on top, as in the table
    ax.set_xlabel("time per step (ms, slowest rank)")
    ax.set_title("Step time per run: median, split into compute and exchange\n(whiskers: 10th–90th percentile)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _save(fig, path)


def _wrap(text: str, width: int = 28) -> str:
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def _same_curve(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-7, abs_tol=1e-12) for x, y in zip(a, b))


def plot_loss(runs: list[Run], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5))
    drawn: list[Run] = []
    for index, run in enumerate(runs):
        twins = [other for other in drawn if _same_curve(other.losses, run.losses)]
        label = run.label if not twins else f"{run.label} (= {twins[0].label})"
        steps = list(range(len(run.losses)))
        ax.plot(
            steps,
            run.losses,
            label=_wrap(label, 45),
            linestyle=_STYLES[len(twins) % len(_STYLES)] if twins else "-",
            linewidth=max(1.0, 3.5 - 1.0 * len(twins)),
            marker=_MARKERS[index % len(_MARKERS)],
            markersize=6,
            markevery=(len(twins) % 3, 3),  # stagger the markers of coinciding curves
            alpha=0.9,
        )
        drawn.append(run)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_title("Loss per step (a curve marked '= X' coincides with run X)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _save(fig, path)


PLOTS = {"memory.png": plot_memory, "time.png": plot_time, "loss.png": plot_loss}
