"""The lines a job ends with: what the run showed, read from its :class:`RunSummary`.

Final loss; optimizer state per rank against what plain DDP + the same optimizer class would
hold on every rank (``ddp_state_bytes``, the planner's prediction); the exchange's share of the
median step; the run dir. The Slurm launcher finds them again in a job's log by their first
line (:data:`FIRST_LINE`)::

    print("\n".join(closing_lines(RunSummary.read(run_dir / SUMMARY_FILE), "Adam", run_dir, 12.3)))
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.app.summary import RunSummary

__all__ = ["FIRST_LINE", "closing_lines"]

#: How the closing block starts (``zero_lab: final loss 0.0123 after 20 steps ...``).
FIRST_LINE = "zero_lab: final loss"


def closing_lines(summary: RunSummary, name: str, run_dir: Path, seconds: float) -> list[str]:
    """What the run showed, in a few lines (module docstring); ``name``: the optimizer class
    that holds the state (:attr:`zero_lab.app.optim_plan.OptimPlan.name`)."""
    world, steps = summary.world_size, len(summary.losses)
    plain = summary.ddp_state_bytes or 0
    held = max(summary.optim_state_bytes)
    if not summary.zero:
        state = f"{_size(held)}, all of it on every rank (plain {name}; a zero_* optimizer shards it)"
        exchange = "none (plain DDP: every rank steps every parameter)"
    else:
        state = (
            f"{_size(held)} on the fullest of {world} rank(s) (imbalance {summary.imbalance:.2f}); "
            f"plain {name} would hold {_size(plain)} on every rank (planner): ÷ {plain / max(held, 1):.2f}"
        )
        exchange = _exchange_share(summary)
    return [
        f"{FIRST_LINE} {summary.final_loss:.6g} after {steps} steps on {world} rank(s) ({seconds:.1f} s)",
        f"  optimizer state per rank: {state}",
        f"  parameter exchange: {exchange}",
        *grad_reduce_lines(summary),
        f"  run dir: {run_dir}",
    ]


def grad_reduce_lines(summary: RunSummary) -> list[str]:
    """With ``grad_reduce=``: the strategy and the bytes each phase sent per step (the fullest
    rank); with ``shard_grads=true`` also the gradients held against a full set."""
    report, sent = summary.grad_reduce, summary.bytes_per_step or {}
    if not report:
        return []
    reduce_bytes, exchange_bytes = max(sent.get("grad_reduce") or [0]), max(sent.get("param_exchange") or [0])
    lines = [
        f"  gradient reduction: {report['strategy']} (grad_reduce={report['requested']}), sent per step per rank: "
        f"{_size(reduce_bytes)} + {_size(exchange_bytes)} exchange"
    ]
    if summary.shard_grads and summary.grad_bytes:
        lines.append(f"  gradients held per rank (shard_grads): {_size(max(summary.grad_bytes))} at most")
    return lines


def _exchange_share(summary: RunSummary) -> str:
    """``12% of the step (median 2.9 of 24.1 ms), 3.00 MiB per step`` (slowest rank's medians)."""
    step, exchange = summary.step_time_s, summary.exchange_time_s or 0.0
    volume = summary.exchange_bytes_per_step or 0.0
    if summary.overlap:
        return f"inside backward (overlap=true: not timed apart), {_size(volume)} per step"
    if not step:
        return f"{_size(volume)} per step"
    if summary.prefetch:
        exposed = summary.exchange_exposed_s or 0.0
        share = (
            f"{exposed / step:.0%} of the step exposed (median {1e3 * exposed:.1f} of {1e3 * step:.1f} ms; "
            f"{1e3 * exchange:.1f} ms in flight, prefetch hid the rest)"
        )
    else:
        share = f"{exchange / step:.0%} of the step (median {1e3 * exchange:.1f} of {1e3 * step:.1f} ms)"
    return f"{share}, {_size(volume)} per step"


def _size(nbytes: float) -> str:
    """Bytes in the largest unit that keeps the number >= 1 (B, KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")
