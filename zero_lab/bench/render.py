"""Markdown tables and verdict lines of a benchmark run (pure: figures in, text out)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from zero_lab.bench.targets import verdict_line

__all__ = [
    "MEMORY_COLUMNS",
    "SPEED_COLUMNS",
    "error_percent",
    "exchange_line",
    "format_table",
    "markdown_table",
    "run_text",
    "targets_text",
]

Column = tuple[str, str, str]

UNPAIRED_NOTE = "† not timed in the same round: a ratio of medians, not paired step by step"

MEMORY_COLUMNS: tuple[Column, ...] = (
    ("state_mib", "Adam state MiB", ".1f"),
    ("state_vs_ddp", "÷ DDP", ".3f"),
    ("state_vs_torch", "÷ torch", ".3f"),
    ("planned_state_ok", "planner exact", ""),
    ("tensor_mib", "tensors MiB", ".0f"),
    ("peak_rss_delta_mib", "peak RSS Δ MiB", ".0f"),
    ("imbalance", "imbalance", ".3f"),
)
SPEED_COLUMNS: tuple[Column, ...] = (
    ("iter_ms", "iteration ms", ".1f"),
    ("iter_vs_torch", "÷ torch", ".3f"),
    ("iter_vs_ddp", "÷ DDP", ".3f"),
    ("exchange_ms", "exchange ms", ".1f"),
    ("collective_ms", "in flight ms", ".1f"),
    ("exposed_ms", "exposed ms", ".1f"),
    ("bytes_vs_min", "param bytes ÷ min", ".3f"),
    ("calls_per_step", "calls", ".0f"),
    ("grad_bytes_vs_min", "grad bytes ÷ min", ".3f"),
    ("max_abs_diff_vs_ddp", "max abs Δparam vs DDP", ".1e"),
)


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, spec)


def markdown_table(titles: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table: a head of ``titles``, ``align`` one letter per column (``l`` text, ``r``
    figures), then one line per row of already formatted cells."""
    if len(align) != len(titles) or set(align) - {"l", "r"}:
        raise ValueError(f"align={align!r}: one of 'l' or 'r' per column, {len(titles)} columns")
    rule = "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"
    return "\n".join(["| " + " | ".join(titles) + " |", rule, *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


def error_percent(predicted: float | None, measured: float | None) -> str:
    """``(predicted - measured) / measured`` as a signed percentage; ``—`` without a measurement."""
    return "—" if predicted is None or not measured else f"{100 * (predicted - measured) / measured:+.1f} %"


def format_table(table: dict[str, dict[str, Any]], columns: Sequence[Column]) -> str:
    """A Markdown table, one row per strategy that has any figure in these columns (unpaired ratios marked †)."""
    head = "| strategy | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "|".join("---:" for _ in columns) + "|"
    rows, marked = [], False
    for name, row in table.items():
        if all(row[key] is None for key, _, _ in columns):
            continue
        cells = []
        for key, _, spec in columns:
            mark = row[key] is not None and key in row.get("unpaired", ())
            marked |= mark
            cells.append(_fmt(row[key], spec) + (" †" if mark else ""))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows, *(["", UNPAIRED_NOTE] if marked else [])])


def exchange_line(name: str, report: dict[str, Any]) -> str:
    """What a zero_lab strategy's exchange does and, with ``auto``, the timings it chose by."""
    line = f"{name}: exchange {report['mode']} (requested {report['requested']})"
    timings = report.get("timings_s") or {}
    if timings:
        measured = ", ".join(f"{collective} {1e3 * seconds:.1f} ms" for collective, seconds in timings.items())
        line += f"; timed at the first step (slowest rank): {measured}"
    grads = report.get("grad_reduce")
    if grads:
        line += f"; grad_reduce {grads['strategy']} (requested {grads['requested']})"
        if grads.get("timings_s"):
            timed = ", ".join(f"{strategy} {1e3 * s:.1f} ms" for strategy, s in grads["timings_s"].items())
            line += f", predicted per step: {timed}"
    return line


def run_text(run: dict[str, Any]) -> str:
    """One model at one world size: heading, notes, the memory table, exchange choices, the speed table."""
    parts = [f"### {run['model']}, W={run['world_size']} — {run['description']}; {run['model_numel']:,} parameters"]
    if run["note"]:
        parts.append(f"({run['note']})")
    parts.append(format_table(run["table"], MEMORY_COLUMNS))
    reports = [exchange_line(n, r["report"]) for n, r in run["results"].items() if r.get("report")]
    if reports:
        parts.append("\n".join(f"- {line}" for line in reports))
    if run["rounds"]:
        parts.append(f"timing rounds: {run['rounds']}")
        parts.append(format_table(run["table"], SPEED_COLUMNS))
    return "\n\n".join(parts)


def targets_text(verdicts: Sequence[dict[str, Any]]) -> str:
    """The verdict on every target this run measured."""
    if not verdicts:
        return "### Targets (W=2)\n\n(no W=2 run measured a target)"
    return "\n".join(["### Targets (W=2)", "", *(verdict_line(v) for v in verdicts)])
