"""The step model's figures: at scale (8 to 1,024 ranks, modelled) and checked against runs here.

Both take plain rows (dicts, as the commands write them to JSON), so the report layer needs
nothing of the benchmark's classes:

* :func:`plot_at_scale` — one model's rows of the at-scale table (``scripts/plan.py --hardware``,
  :meth:`zero_lab.bench.at_scale.Row.as_dict`: ``strategy``, ``world_size``, ``shard_size``,
  ``predicted_s`` (the step), ``memory_bytes``): step time per rank (left, log y) and memory per
  rank (right) against W on a log₂ axis; a colour and marker per strategy, a line style per group
  size S (``S=W`` solid), so each (strategy, S) is one line and the legend stays short.
* :func:`plot_model_check` — the rows of ``scripts/check_model.py`` (``model``, ``world_size``,
  ``shard_size``, ``strategy``, ``predicted_s``, ``measured_s``, ``predicted_bytes``,
  ``measured_bytes``; ``measured_runs``, the repeats, drawn as a horizontal bar from the fastest to
  the slowest): predicted against measured step time (left, log–log, the y = x line and
  the ±20 % band, hierarchical rows — ``shard_size`` < W — drawn as red-edged stars) and the
  bytes error of every row (right, the ±2 % band, the value written beside each bar). Rows are
  numbered: the number beside a point is the row named ``n  model W [S] strategy`` on the right
  (thirty names beside thirty points would cover each other). Rows with no measured time are left
  out of the left panel and counted in its title.

Usage::

    plot_at_scale([r for r in rows if r["model"] == "gpt2-xl"], Path("at_scale-gpt2-xl.png"), "gpt2-xl on h100_ib")
    plot_model_check(checks, Path("model_check.png"), "W = 1-4 on gloo_local, under load (load 9.8, 2 cores)")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: figures are written, never shown
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from zero_lab.files import write_atomic

__all__ = [
    "BYTES_BAND",
    "TIME_BAND",
    "at_scale_figure",
    "model_check_figure",
    "plot_at_scale",
    "plot_model_check",
    "shard_label",
]

#: The issue's bars: predictions within ±20 % of the measured step time, ±2 % of the measured bytes.
TIME_BAND = 0.20
BYTES_BAND = 0.02
DPI = 100
GIB = 2**30
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
_SHARD_STYLES = {"S=W": "-", "S=8": "--", "S=1": ":"}
#: Plain numbers on a log axis, at 1, 2 and 5 per decade (not 2×10²).
_PLAIN = FuncFormatter(lambda value, _: f"{value:,.10g}")
_OTHER_STYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))

Rows = Sequence[Mapping[str, Any]]


def shard_label(row: Mapping[str, Any]) -> str:
    """``S=W`` when the state is sharded over the whole world, else ``S=<shard_size>``."""
    shard = row.get("shard_size") or row["world_size"]
    return "S=W" if shard == row["world_size"] else f"S={shard}"


def _shard_order(label: str) -> float:
    """``S=W`` first, then the groups from the largest down (``S=1``, no sharding, last)."""
    return float("-inf") if label == "S=W" else -int(label[2:])


def _first_seen(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _shard_styles(labels: Sequence[str]) -> dict[str, Any]:
    others = iter(_OTHER_STYLES * len(labels))
    return {label: _SHARD_STYLES.get(label) or next(others) for label in labels}


def _world_axis(ax: plt.Axes, worlds: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(worlds))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{w:,}" for w in worlds])
    ax.set_xlabel("world size W (ranks, log scale)")
    ax.grid(alpha=0.3, which="both")


def _log_values(ax: plt.Axes, which: str) -> None:
    """``ax``'s ``which`` axis ("x" or "y") on a log scale labelled in plain numbers at 1, 2 and 5 per decade."""
    getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(_PLAIN)
    axis.set_minor_formatter(NullFormatter())


def at_scale_figure(rows: Rows, title: str) -> plt.Figure:
    """The at-scale figure of one model's rows (:func:`plot_at_scale` saves it); a ``ValueError``
    when the rows are empty or hold several models."""
    models = _first_seen([r.get("model", "") for r in rows])
    if len(models) != 1:
        raise ValueError(f"plot_at_scale: rows of exactly one model, got {models or 'none'}; split them by 'model'")
    strategies = _first_seen([r["strategy"] for r in rows])
    shards = sorted(_first_seen([shard_label(r) for r in rows]), key=_shard_order)
    styles = _shard_styles(shards)
    worlds = sorted({int(r["world_size"]) for r in rows})
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(12, 5))
    for index, name in enumerate(strategies):
        for shard in shards:
            series = sorted(
                (r for r in rows if r["strategy"] == name and shard_label(r) == shard), key=lambda r: r["world_size"]
            )
            if not series:
                continue
            style = {
                "color": f"C{index % 10}",
                "marker": _MARKERS[index % len(_MARKERS)],
                "linestyle": styles[shard],
                "markersize": 5,
                "linewidth": 1.6,
                "label": f"{name} {shard}",
            }
            xs = [r["world_size"] for r in series]
            time_ax.plot(xs, [1e3 * r["predicted_s"] for r in series], **style)
            memory_ax.plot(xs, [r["memory_bytes"] / GIB for r in series], **style)
    _world_axis(time_ax, worlds)
    _world_axis(memory_ax, worlds)
    _log_values(time_ax, "y")
    time_ax.set_ylabel("step time (ms, log scale)")
    time_ax.set_title("step time per rank")
    memory_ax.set_ylim(bottom=0)
    memory_ax.set_ylabel("memory per rank (GiB, the fullest rank)")
    memory_ax.set_title("memory per rank (parameters, gradients, buckets, state)")
    by_strategy = [
        Line2D([], [], color=f"C{i % 10}", marker=_MARKERS[i % len(_MARKERS)], label=name)
        for i, name in enumerate(strategies)
    ]
    by_shard = [Line2D([], [], color="black", linestyle=styles[s], label=f"sharded over {s}") for s in shards]
    handles = [*by_strategy, *by_shard]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(handles) - 1) // 5), 1, 1))  # room for the legend's rows
    return fig


def plot_at_scale(rows: Rows, path: Path, title: str) -> Path:
    """Write :func:`at_scale_figure` of ``rows`` (one model) as a PNG at ``path``; returns ``path``."""
    return _save(at_scale_figure(rows, title), Path(path))


def _check_name(row: Mapping[str, Any]) -> str:
    shard = shard_label(row)
    hier = f" {shard}" if shard != "S=W" else ""
    return f"{row['model']} W={row['world_size']}{hier} {row['strategy']}"


def _hierarchical(row: Mapping[str, Any]) -> bool:
    return shard_label(row) != "S=W"


def _error(predicted: float, measured: float | None) -> float | None:
    return None if not measured else (predicted - measured) / measured


def model_check_figure(checks: Rows, title: str) -> plt.Figure:
    """The model-check figure (:func:`plot_model_check` saves it): every row numbered, the number
    beside its point on the left and before its name on the right (the key)."""
    fig, (time_ax, bytes_ax) = plt.subplots(
        1, 2, figsize=(14, max(5.5, 0.2 * len(checks) + 2.0)), gridspec_kw={"width_ratios": [1.2, 1.0]}
    )
    _time_panel(time_ax, checks)
    _bytes_panel(bytes_ax, checks)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _time_panel(ax: plt.Axes, checks: Rows) -> None:
    timed = [(number, c) for number, c in enumerate(checks, 1) if c.get("measured_s")]
    models = _first_seen([c["model"] for _, c in timed])
    strategies = _first_seen([c["strategy"] for _, c in timed])
    values = [1e3 * c[key] for _, c in timed for key in ("measured_s", "predicted_s")]
    low, high = (min(values) / 1.5, max(values) * 1.5) if values else (1.0, 10.0)
    ax.fill_between(
        [low, high],
        [low * (1 - TIME_BAND), high * (1 - TIME_BAND)],
        [low * (1 + TIME_BAND), high * (1 + TIME_BAND)],
        color="tab:green",
        alpha=0.15,
        label=f"±{TIME_BAND:.0%} of measured",
    )
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
    for number, c in timed:
        x, y = 1e3 * c["measured_s"], 1e3 * c["predicted_s"]
        color = f"C{strategies.index(c['strategy']) % 10}"
        runs = c.get("measured_runs") or ()
        if len(runs) > 1:  # the repeats' band, min to max
            ax.plot([1e3 * min(runs), 1e3 * max(runs)], [y, y], color=color, linewidth=1, alpha=0.7, zorder=2)
        if _hierarchical(c):
            ax.scatter(x, y, marker="*", s=220, color=color, edgecolors="red", linewidths=1.5, zorder=4)
        else:
            marker = _MARKERS[models.index(c["model"]) % len(_MARKERS)]
            ax.scatter(x, y, marker=marker, s=40, color=color, edgecolors="black", linewidths=0.6, zorder=3)
        ax.annotate(str(number), (x, y), xytext=(4, 2), textcoords="offset points", fontsize=7)
    handles = [
        *ax.get_legend_handles_labels()[0],
        *[Line2D([], [], linestyle="", marker="o", color=f"C{i % 10}", label=s) for i, s in enumerate(strategies)],
        *[
            Line2D([], [], linestyle="", marker=_MARKERS[i % len(_MARKERS)], color="grey", label=m)
            for i, m in enumerate(models)
        ],
    ]
    if any(_hierarchical(c) for _, c in timed):
        handles.append(
            Line2D([], [], linestyle="", marker="*", markersize=12, color="grey", markeredgecolor="red",
                   label="hierarchical (S < W, e.g. 2 × 2)")
        )  # fmt: skip
    ax.legend(handles=handles, fontsize=7, loc="upper left")
    _log_values(ax, "x")
    _log_values(ax, "y")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured step time (ms, slowest rank's median; bars: the repeats' min–max)")
    ax.set_ylabel("predicted step time (ms)")
    untimed = len(checks) - len(timed)
    left_out = f"; {untimed} row(s) without a measured time left out" if untimed else ""
    ax.set_title(f"step time: predicted vs measured (numbers: the rows on the right){left_out}", fontsize=10)
    ax.grid(alpha=0.3, which="both")


def _bytes_panel(ax: plt.Axes, checks: Rows) -> None:
    """A bar per row (its error in %), the value written beside it; rows with nothing counted say so."""
    errors = [_error(c["predicted_bytes"], c.get("measured_bytes")) for c in checks]
    percent = [0.0 if e is None else 100 * e for e in errors]
    ys = list(range(len(checks)))
    colors = ["tab:blue" if abs(e) <= 100 * BYTES_BAND else "tab:red" for e in percent]
    edges = ["red" if _hierarchical(c) else "black" for c in checks]
    ax.axvspan(-100 * BYTES_BAND, 100 * BYTES_BAND, color="tab:green", alpha=0.15, label=f"±{BYTES_BAND:.0%}")
    ax.axvline(0, color="black", linewidth=1)
    widths = [1.5 if edge == "red" else 0.6 for edge in edges]
    ax.barh(ys, percent, height=0.6, color=colors, edgecolor=edges, linewidth=widths)
    span = max([100 * BYTES_BAND * 2, *[abs(e) * 1.3 for e in percent]])
    for y, error in zip(ys, errors):
        note = "nothing counted" if error is None else f"{100 * error:+.1f} %"
        ax.text(span * 0.97, y, note, fontsize=6, ha="right", va="center")
    ax.set_yticks(ys, [f"{n}  {_check_name(c)}" for n, c in enumerate(checks, 1)], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(-span, span)
    ax.set_xlabel("bytes per step: (predicted − measured) / measured (%)")
    ax.set_title("bytes error per row (red edge: hierarchical)", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(axis="x", alpha=0.3)


def plot_model_check(checks: Rows, path: Path, title: str) -> Path:
    """Write :func:`model_check_figure` of ``checks`` as a PNG at ``path``; returns ``path``."""
    return _save(model_check_figure(checks, title), Path(path))


def _save(fig: plt.Figure, path: Path) -> Path:
    """Saved atomically (:func:`zero_lab.files.write_atomic`): a reader never sees half a PNG."""
    try:
        return write_atomic(path, lambda f: fig.savefig(f, dpi=DPI, format="png", bbox_inches="tight"))
    finally:
        plt.close(fig)
