"""The report's table: one row per complete run, values in units scaled to each value.

Columns (every "per rank" value is the max over ranks unless it says min):

* state max / min — bytes of the optimizer-state tensors on the fullest / emptiest rank;
* ÷ DDP — state max over what DDP + the plain optimizer holds per rank: measured by a
  plain-optimizer run of the same base optimizer, model and dtype in the report, else the
  planner's prediction saved in ``summary.json`` (``ddp_state_bytes``, marked "plan");
* ÷ ideal — state max over the ideal ZeRO share, DDP's state / W (1.00 = perfect balance);
* imbalance — the partition's max / ideal element count (``summary.json``);
* tensors — params + grads + buffers + state + master weights (``memory/tensor_bytes``);
* peak RSS / CUDA — the process's peak (CPU: RSS, dominated by torch itself);
* exchanged, exchange, step — the parameter exchange's bytes and time per step and the
  step time (medians over steps after the first, slowest rank);
* samples/s, final loss.

    rows = table_rows(runs)          # list of rows of Cell
    print(markdown(rows))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zero_lab.app.record.catalogue import (
    EXCHANGE_BYTES,
    EXCHANGE_S,
    IMBALANCE,
    OPTIM_STATE_BYTES,
    OPTIM_STEP_S,
    PEAK_BYTES,
    SAMPLES_PER_S,
    STEP_S,
    TENSOR_BYTES,
)
from zero_lab.report.runs import Run

__all__ = [
    "COLUMNS",
    "Baseline",
    "Cell",
    "Column",
    "byte_unit",
    "ddp_baseline",
    "format_bytes",
    "format_ms",
    "legend_lines",
    "markdown",
    "table_rows",
]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _three_digits(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def byte_unit(value: float) -> tuple[float, str]:
    """``(divisor, unit)`` of the largest unit that keeps ``value`` >= 1: 33548 -> (1024, "KiB")."""
    index = 0
    while abs(value) >= 1024 ** (index + 1) and index < len(_UNITS) - 1:
        index += 1
    return 1024.0**index, _UNITS[index]


def format_bytes(value: float | None) -> str:
    """``33548`` -> ``"32.8 KiB"``; ``None`` -> ``"–"``."""
    if value is None:
        return "–"
    divisor, unit = byte_unit(value)
    scaled = value / divisor
    return f"{scaled:.0f} {unit}" if unit == "B" else f"{_three_digits(scaled)} {unit}"


def format_ms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds == 0:
        return "0 ms"
    return f"{_three_digits(seconds * 1e3)} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


@dataclass(frozen=True)
class Cell:
    """What one table cell shows, what it sorts by, and where it links to (a path)."""

    text: str
    sort: float | str | None = None
    link: str | None = None
    numeric: bool = True


@dataclass(frozen=True)
class Baseline:
    """DDP's per-rank optimizer state for a run, and where it came from."""

    state_bytes: float
    source: str  # "measured" (a plain-optimizer run in the report) or "plan" (the planner)


def _ddp_key(run: Run) -> tuple[str, str, object, str]:
    choices = run.meta.get("choices") or run.summary.choices
    optim = str(choices.get("optim", "?")).removeprefix("zero_")
    return optim, str(choices.get("model")), run.summary.model_params, str(run.summary.param_dtype)


def ddp_baseline(run: Run, runs: list[Run]) -> Baseline | None:
    """DDP + the plain optimizer's per-rank state for ``run``'s model (see the module docstring)."""
    measured = [
        max(other.per_rank(OPTIM_STATE_BYTES.name) or [0.0])
        for other in runs
        if not other.summary.zero and _ddp_key(other) == _ddp_key(run)
    ]
    if measured and max(measured) > 0:
        return Baseline(max(measured), "measured")
    planned = run.summary.ddp_state_bytes
    return Baseline(float(planned), "plan") if planned else None


def _max(values: list[float] | None) -> float | None:
    return max(values) if values else None


def _bytes(value: float | None) -> Cell:
    return Cell(format_bytes(value), value)


def _ratio(value: float | None, note: str = "") -> Cell:
    if value is None:
        return Cell("–", None)
    return Cell(f"{value:.2f}{note}", value)


def _vs_ddp(run: Run, runs: list[Run]) -> Cell:
    base, state = ddp_baseline(run, runs), _max(run.per_rank(OPTIM_STATE_BYTES.name))
    if base is None or state is None:
        return _ratio(None)
    return _ratio(state / base.state_bytes, " (plan)" if base.source == "plan" else "")


def _vs_ideal(run: Run, runs: list[Run]) -> Cell:
    base, state = ddp_baseline(run, runs), _max(run.per_rank(OPTIM_STATE_BYTES.name))
    if base is None or state is None:
        return _ratio(None)
    return _ratio(state / (base.state_bytes / run.world_size))


def _run_link(run: Run, runs: list[Run]) -> Cell:
    return Cell(run.label, run.label, link=str(run.path), numeric=False)


@dataclass(frozen=True)
class Column:
    title: str
    cell: CellFn
    help: str


CellFn = Callable[[Run, list[Run]], Cell]


def _plain(value: Callable[[Run], float | None], fmt: Callable[[float | None], str]) -> CellFn:
    def cell(run: Run, runs: list[Run]) -> Cell:
        number = value(run)
        return Cell(fmt(number), number)

    return cell


def _number(digits: str) -> Callable[[float | None], str]:
    return lambda value: "–" if value is None else format(value, digits)


def _local_steps(run: Run) -> Cell:
    """``12.1 / 30.4`` ms by rank (the median of ``time/optim_step_s/rank{r}``); sorts by the slowest."""
    steps = run.per_rank(OPTIM_STEP_S.name)
    if not steps:
        return Cell("–", None)
    return Cell(" / ".join(f"{1000 * s:.1f}" for s in steps), max(steps))


def _sent_by_phase(run: Run) -> Cell:
    """``1.50 MiB + 1.50 MiB``: bytes the fullest rank sent per step reducing gradients (grad_reduce=)
    and exchanging parameters (median over steps); sorts by their sum. ``–`` without grad_reduce."""
    sent = run.summary.bytes_per_step or {}
    reduced, exchanged = sent.get("grad_reduce"), sent.get("param_exchange") or []
    if not reduced:
        return Cell("–", None)
    per_rank = [g + (exchanged[r] if r < len(exchanged) else 0.0) for r, g in enumerate(reduced)]
    text = format_bytes(max(reduced)) + (f" + {format_bytes(max(exchanged))}" if exchanged else "")
    return Cell(text, max(per_rank))


def _sent_across(run: Run) -> Cell:
    """``0 B / 1.50 MiB``: bytes the fullest rank sent per step across shard groups (``dist.shard_size``)
    and across nodes, both phases together (summary.json's ``bytes_per_link``); sorts by the first.
    ``–`` for runs without that record."""
    links = [v for v in (run.summary.bytes_per_link or {}).values() if v]
    if not links:
        return Cell("–", None)

    def fullest(link: str) -> float:
        per_rank = [sum(values) for values in zip(*(phase[link] for phase in links if phase.get(link)))]
        return max(per_rank, default=0.0)

    groups, nodes = fullest("inter_group"), fullest("inter_node")
    return Cell(f"{format_bytes(groups)} / {format_bytes(nodes)}", groups)


COLUMNS: tuple[Column, ...] = (
    Column("run", _run_link, "the overrides that set this run apart; links to its run dir"),
    Column("W", _plain(lambda r: r.world_size, _number("d")), "world size (ranks)"),
    Column(
        "state/rank max",
        lambda r, _: _bytes(_max(r.per_rank(OPTIM_STATE_BYTES.name))),
        "optimizer-state tensors, fullest rank",
    ),
    Column(
        "state/rank min",
        lambda r, _: _bytes(min(r.per_rank(OPTIM_STATE_BYTES.name) or [0.0])),
        "optimizer-state tensors, emptiest rank",
    ),
    Column("÷ DDP", _vs_ddp, "state max / DDP + plain optimizer's state per rank ('plan': planner's prediction)"),
    Column("÷ ideal 1/W", _vs_ideal, "state max / (DDP's state / W); 1.00 is a perfect split"),
    Column(IMBALANCE.name, _plain(lambda r: r.summary.imbalance, _number(".3f")), "partition max / ideal"),
    Column(
        "tensors/rank",
        lambda r, _: _bytes(_max(r.per_rank(TENSOR_BYTES.name))),
        "params + grads + buffers + state (+ master weights), measured from the tensors, max rank",
    ),
    Column(
        "peak RSS/CUDA",
        lambda r, _: _bytes(_max(r.per_rank(PEAK_BYTES.name))),
        "process peak: RSS on CPU (mostly torch itself), CUDA peak allocated on GPU",
    ),
    Column(
        "exchanged/step",
        _plain(lambda r: r.median(EXCHANGE_BYTES.at("max")), format_bytes),
        "parameter-exchange bytes per step (median)",
    ),
    Column(
        "sent/step: grads + params",
        lambda r, _: _sent_by_phase(r),
        "bytes the fullest rank sent per step by phase (grad_reduce=: the gradient reduction + the exchange; "
        "DDP's all-reduce with grad_reduce=all_reduce), measured by the Communicator",
    ),
    Column(
        "sent/step across groups / nodes",
        lambda r, _: _sent_across(r),
        "of those bytes, what the fullest rank sent across shard groups (dist.shard_size) and across nodes",
    ),
    Column(
        "grads/rank",
        lambda r, _: _bytes(_max(r.summary.grad_bytes) if r.summary.grad_bytes else None),
        "gradient bytes held after backward (param.grad + DDP's buckets with grad_reduce=), fullest rank",
    ),
    Column(
        "exchange",
        _plain(lambda r: r.median(EXCHANGE_S.at("max")), format_ms),
        "parameter-exchange time per step (median, slowest rank)",
    ),
    Column(
        "step",
        _plain(lambda r: r.median(STEP_S.at("max")), format_ms),
        "step time (median over steps after the first, slowest rank)",
    ),
    Column(
        "optim step/rank",
        lambda r, _: _local_steps(r),
        "local optimizer step per rank, ms (median; ZeRO: its own shards, without the exchange)",
    ),
    Column(
        "slowest ÷ mean",
        _plain(lambda r: r.summary.optim_step_max_over_mean, _number(".2f")),
        "local optimizer step, slowest rank ÷ mean (median over steps): the partition's cost imbalance",
    ),
    Column("samples/s", _plain(lambda r: r.median(str(SAMPLES_PER_S.key)), _number(".0f")), "global batch / step"),
    Column("final loss", _plain(lambda r: float(r.summary.final_loss), _number(".6g")), "loss at the last step"),
    Column(
        "val loss",
        _plain(lambda r: r.summary.final_val_loss, _number(".6g")),
        "held-out loss at the last validation (eval_every=N)",
    ),
)


def legend_lines() -> list[str]:
    """What each column means, one ``**title**: help`` line each (report.md's legend)."""
    return [f"- **{column.title}**: {column.help}" for column in COLUMNS]


def table_rows(runs: list[Run]) -> list[list[Cell]]:
    return [[column.cell(run, runs) for column in COLUMNS] for run in runs]


def markdown(rows: list[list[Cell]], link_base: Callable[[str], str] = str) -> str:
    """A GitHub-flavoured table; the run column links to the run dir (``link_base`` maps
    the path, e.g. to one relative to the report)."""

    def text(cell: Cell) -> str:
        shown = cell.text.replace("|", "\\|")
        return f"[{shown}]({link_base(cell.link)})" if cell.link else shown

    aligns = ["---" if not cell.numeric else "---:" for cell in rows[0]] if rows else ["---"] * len(COLUMNS)
    lines = ["| " + " | ".join(c.title for c in COLUMNS) + " |", "| " + " | ".join(aligns) + " |"]
    lines += ["| " + " | ".join(text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
