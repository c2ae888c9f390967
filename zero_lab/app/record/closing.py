"""What a job says when it ends: the closing lines of a finished run, or how its ranks failed.

:func:`closing_lines` reads the run's :class:`RunSummary`, each line only when it applies: the
final loss; resume, accumulation, validation; optimizer state per rank against DDP + the same
optimizer classes; each rank's local optimizer step (Muon, or a ``partitioner.cost`` other than
``numel``); the exchange's share of the step and the bytes it moves; the gradient reduction's
bytes per phase; which data-parallel path trained and why (the engine's modes); the run dir. The
Slurm launcher finds them again in a job's log by their first line (:data:`FIRST_LINE`).
:func:`describe_failure` says which rank failed and how, :func:`resume_hint` how to continue a
failed or stopped run::

    print("\n".join(closing_lines(RunSummary.read(run_dir / SUMMARY_FILE), "Adam", run_dir, 12.3)))
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from zero_lab.app.plan.strategy import Strategy
from zero_lab.app.record.checkpoint_finder import find_any, step_of_any
from zero_lab.app.record.run_files import COMMAND, LOGS_DIR
from zero_lab.app.record.summary import RunSummary
from zero_lab.files import write_atomic
from zero_lab.runtime.spawn import RankFailure, RankStalled, describe_exit, last_line

__all__ = ["FIRST_LINE", "closing_lines", "describe_failure", "grad_reduce_lines", "resume_hint"]

#: How the closing block starts (``zero_lab: final loss 0.0123 after 20 steps ...``).
FIRST_LINE = "zero_lab: final loss"
#: Ranks whose local step times are listed one by one (more: the fastest and the slowest).
LISTED_RANKS = 8


def closing_lines(summary: RunSummary, name: str, run_dir: Path, seconds: float) -> list[str]:
    """What the run showed, in a few lines (module docstring); ``name``: the optimizer class
    that holds the state (:attr:`zero_lab.app.plan.optim_plan.OptimPlan.name`), used when the
    summary does not name the classes (``optimizer_classes``)."""
    world, steps = summary.world_size, len(summary.losses)
    classes = "/".join(summary.optimizer_classes) if summary.optimizer_classes else name
    lines = [f"{FIRST_LINE} {summary.final_loss:.6g} after {steps} steps on {world} rank(s) ({seconds:.1f} s)"]
    lines += _loop_lines(summary)
    lines.append(f"  optimizer state per rank: {_state(summary, classes)}")
    if _local_steps_differ(summary):
        lines.append(f"  optimizer step per rank: {_local_steps(summary)}")
    exchange = Strategy.of(summary.zero, summary.dp).exchange_line(_exchange_share(summary))
    lines += [f"  parameter exchange: {exchange}{_auto_choice(summary)}", *grad_reduce_lines(summary)]
    lines += _data_parallel_lines(summary)
    return [*lines, f"  run dir: {run_dir}"]


def _data_parallel_lines(summary: RunSummary) -> list[str]:
    """Which path trained and why (``dp=auto`` resolved); the engine's modes and the gradient bytes rank 0
    held at most against the bound, or the DDP path's switches."""
    choice = summary.dp_choice or {}
    why = choice["reason"] if choice.get("requested") == "auto" else f"dp={summary.dp}"
    modes = summary.engine
    if summary.dp != "zero_lab" or not modes:
        switches = [f"{key}=true" for key in ("overlap", "bucket_view", "compile") if getattr(summary, key)]
        if summary.grad_reduce:
            switches.append(f"grad_reduce={summary.grad_reduce['requested']}")
        shown = [s for s in switches if s not in why]  # the reason names the one that chose DDP already
        strategy = Strategy.of(summary.zero)
        zero = ", then ZeRO steps each rank's shard" if strategy.shards_state else ""
        return [f"  data parallel: torch's DDP{zero} ({why}){': ' + ', '.join(shown) if shown else ''}"]
    return [
        f"  data parallel: zero_lab.ShardedDataParallel ({why}): grad_reduce={modes['grad_reduce']}, "
        f"exchange={modes['exchange']}, prefetch={str(modes['prefetch']).lower()}, {modes['buckets']} bucket(s) "
        f"of at most {modes['bucket_cap_mb']} MiB, partitioner {modes['partitioner']}"
        + (f"; {modes['transport_note']}" if modes.get("transport_note") else ""),
        f"  gradients held on rank 0: {_size(modes['peak_grad_bytes'])} at most, measured "
        f"(bound: owned + two buckets = {_size(modes['grad_hold_bound'])})",
    ]


def _loop_lines(summary: RunSummary) -> list[str]:
    """Resume, accumulation and validation, each only when it ran."""
    out = []
    if where := summary.resumed_checkpoint or summary.resumed_from:
        policy = f" (resume_optimizer={summary.resume_optimizer})" if summary.resume_optimizer else ""
        out.append(f"  resumed from {where} at step {summary.start_step}{policy}")
    if summary.accumulate > 1:
        out.append(f"  accumulate={summary.accumulate}: each step summed {summary.accumulate} micro-batches per rank")
    if summary.final_val_loss is not None:
        best = f", best {summary.best_val_loss:.6g}" if summary.best_val_loss is not None else ""
        batches = f", {summary.eval_batches} batches each" if summary.eval_batches else ""
        every = f" (eval_every={summary.eval_every}{batches})" if summary.eval_every else ""
        out.append(f"  validation loss: final {summary.final_val_loss:.6g}{best}{every}")
    return out


def _state(summary: RunSummary, classes: str) -> str:
    """The state line: all of it on every rank (plain), or the fullest rank against DDP's.

    ``ddp_state_bytes`` is priced over the parameters that have state on some rank, so the
    ranks together hold at least that much and the fullest at least 1/W of it: a larger
    "÷" would be a measurement or planner error, and is never printed."""
    held = max(summary.optim_state_bytes) if summary.optim_state_bytes else 0.0
    strategy = Strategy.of(summary.zero, summary.dp)
    ddp_bytes = summary.ddp_state_bytes or 0
    return strategy.state_line(held, ddp_bytes, summary.world_size, summary.imbalance, classes, _size)


def _local_steps_differ(summary: RunSummary) -> bool:
    """Muon (a class that steps whole matrices) or a cost model other than ``numel``: the local
    step's time per rank is what the partition balances, so it is shown."""
    if not summary.optim_step_s:
        return False
    cost = (summary.partition or {}).get("cost")
    return summary.elementwise is False or (cost is not None and cost != "numel")


def _local_steps(summary: RunSummary) -> str:
    """``4.1 / 6.3 ms (median per rank), slowest ÷ mean 1.21 (partitioner.cost=newton_schulz)``."""
    seconds = summary.optim_step_s or []
    scale, unit = (1.0, "s") if max(seconds) >= 1 else (1e3, "ms")
    times = [scale * s for s in seconds]
    if len(times) <= LISTED_RANKS:
        shown = " / ".join(f"{t:.1f}" for t in times) + f" {unit} (median per rank)"
    else:
        shown = f"{min(times):.1f} … {max(times):.1f} {unit} (medians of {len(times)} ranks)"
    ratio = summary.optim_step_max_over_mean
    spread = f", slowest ÷ mean {ratio:.2f}" if ratio is not None else ""
    cost = (summary.partition or {}).get("cost")
    return f"{shown}{spread}" + (f" (partitioner.cost={cost})" if cost else "")


def grad_reduce_lines(summary: RunSummary) -> list[str]:
    """With ``grad_reduce=``: the strategy and the bytes one rank sent per step in each phase
    (``bytes_per_step``, measured; the most any rank sent), named as summary.json names them — not
    the model's exchanged parameters, which the exchange line gives; with ``release_grads=true``
    also the gradients held after backward (the peak during backward is DDP's)."""
    report, sent = summary.grad_reduce, summary.bytes_per_step or {}
    if not report:
        return []
    phases = ", ".join(f"{phase} {_size(max(sent.get(phase) or [0]))}" for phase in ("grad_reduce", "param_exchange"))
    lines = [
        f"  gradient reduction: {report['strategy']} (grad_reduce={report['requested']}); "
        f"sent per rank per step, measured (max over ranks): {phases}"
    ]
    if summary.release_grads and summary.grad_bytes:
        held = _size(max(summary.grad_bytes))
        lines.append(f"  gradients held per rank after backward (release_grads): {held} at most")
    return lines


def _auto_choice(summary: RunSummary) -> str:
    """``exchange=auto``: which collective it chose and, when others timed within the noise of it,
    that the choice was a near-tie kept by preference (zero_lab.auto: the same config, the same choice)."""
    report = summary.exchange or {}
    if report.get("requested") != "auto" or report.get("collective") in (None, "auto", "none"):
        return ""
    ties = report.get("within_noise") or []
    tie = f"; {', '.join(ties)} within the noise of it, the preferred one kept" if ties else ""
    return f"; exchange=auto chose {report['collective']}{tie}"


def _exchange_share(summary: RunSummary) -> str:
    """``12% of the step (median 2.9 of 24.1 ms), 3.00 MiB of parameters exchanged per step (the
    model's)`` (slowest rank's medians; the bytes are the exchanged parameters', not one rank's sent bytes)."""
    step, exchange = summary.step_time_s, summary.exchange_time_s or 0.0
    volume = f"{_size(summary.exchange_bytes_per_step or 0.0)} of parameters exchanged per step (the model's)"
    if summary.overlap:
        return f"inside backward (overlap=true: not timed apart), {volume}"
    if not step:
        return volume
    if summary.prefetch:
        exposed = summary.exchange_exposed_s or 0.0
        share = (
            f"{exposed / step:.0%} of the step exposed (median {1e3 * exposed:.1f} of {1e3 * step:.1f} ms; "
            f"{1e3 * exchange:.1f} ms in flight, prefetch hid the rest)"
        )
    else:
        share = f"{exchange / step:.0%} of the step (median {1e3 * exchange:.1f} of {1e3 * step:.1f} ms)"
    return f"{share}, {volume}"


def _size(nbytes: float) -> str:
    """Bytes in the largest unit that keeps the number >= 1 (B, KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB"):
        if abs(nbytes) < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.2f} GiB"


def resume_hint(run_dir: Path, meta: dict[str, Any]) -> str:
    """How to continue a stopped or failed run, as one clause: ``continue from step 4
    (<run dir>/checkpoints/step_00000004.dcp) with: python train.py <the same overrides>
    resume=<run dir>``, naming the newest complete checkpoint of either format
    (:func:`~zero_lab.app.record.checkpoint_finder.find_any`, the finder ``resume=`` itself uses, so
    the command resumes that one); with none, ``no complete checkpoint in <run dir>/checkpoints to
    resume from; start again with: <the job's own command>``. Commands are shell-quoted so they can be
    pasted as is (paths with spaces, overrides with brackets), the run dir also quoted for Hydra's
    override parser where it would read it otherwise (a comma: a sweep)."""
    found = find_any(run_dir)
    if found is None:
        again = shlex.join([*COMMAND, *meta.get("overrides", [])])
        return f"no complete checkpoint in {run_dir / 'checkpoints'} to resume from; start again with: {again}"
    kept = [o for o in meta.get("overrides", []) if not o.startswith(("resume=", "hydra."))]
    command = shlex.join([*COMMAND, *kept, f"resume={hydra_quoted(str(run_dir))}"])
    return f"continue from step {step_of_any(found)} ({found}) with: {command}"


_HYDRA_PLAIN = re.compile(r"[\w./:@%+~-]+")


def hydra_quoted(value: str) -> str:
    """``value`` as a Hydra override value that parses back to itself: as is when plain,
    else single-quoted (``'/runs/a,b'``; a quote inside escaped as ``\\'``)."""
    return value if _HYDRA_PLAIN.fullmatch(value) else "'" + value.replace("'", "\\'") + "'"


def describe_failure(failure: RankFailure, run_dir: Path) -> str:
    """Which rank failed and how (its error's own message, first line — or the signal / exit
    code it died of, or how it stalled), where its log is, and its full traceback saved in
    the run dir."""
    path = run_dir / LOGS_DIR / f"rank{failure.rank}.error.txt"
    write_atomic(path, lambda f: f.write(failure.details.encode("utf-8")))
    stalled = isinstance(failure, RankStalled)
    if failure.exitcode is None:
        what = failure.summary.removeprefix("stalled: ")
    elif failure.exitcode < 0:
        what = f"its process was {describe_exit(failure.exitcode)}"
    else:
        what = f"its process ended with {describe_exit(failure.exitcode)} before reporting"
    others = sorted(failure.others.items())
    if stalled:  # the others' /proc states, or the peer that waited
        echoes = "".join(f"\n  (rank {r}: {last_line(d)[:200]})" for r, d in others)
    else:
        echoes = "".join(f"\n  (rank {r} {_echo(d, failure.details)})" for r, d in others)
    log_path = run_dir / LOGS_DIR / f"rank{failure.rank}.log"
    verb = "stalled" if stalled else "failed"
    return f"rank {failure.rank} {verb}: {what}\n  its log: {log_path}\n  full traceback: {path}{echoes}"


def _echo(details: str, first: str) -> str:
    """Another rank's failure beside the first: the same error (a checkpoint every rank
    refused), or what it failed of after it (often only the first one's echo)."""
    line = last_line(details)
    return "failed too, with the same error" if line == last_line(first) else f"failed after it: {line[:200]}"
