"""Find the runs below a dir, read what the report needs, and label each by what sets it apart.

A *run dir* holds ``meta.json`` (the job writes it before its ranks start), Hydra's
``.hydra/`` or a ``summary.json``; nothing below a run dir is searched (its ``wandb/``,
``checkpoints/``). A run is *complete* when its ``summary.json`` covers every step; every
other run dir becomes a :class:`Failed` with the reason its files give (a rank's error
file, the signal that stopped it, how many steps it logged, or that it never started).

Labels (:func:`label_runs`): each run's Hydra overrides (``.hydra/overrides.yaml``, else
``meta.json``) are read as ``key -> value``; the keys whose value is not the same in every
run form the label, e.g. ``optim.master_weights=true param_dtype=bfloat16``. A run that
did not override such a key shows its own value (its group choice or resolved config).
Runs with identical overrides get their run dir appended, so no two runs share a label
and none is ever merged with another. A sweep job that repeated an earlier one was not run
(:mod:`zero_lab.app.launch.repeats`: its run dir holds ``repeat_of.json``): it is no run of its own,
and :func:`find_repeats` names it beside the run it repeats.

    runs, failed = find_runs(Path("outputs/multirun/2026-11-23/10-00-00"))
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from hydra.errors import OverrideParseException

from zero_lab.app.config.overrides import read
from zero_lab.app.launch.repeats import read_repeat
from zero_lab.app.record.run_files import LOGS_DIR, META_FILE, METRICS_FILE
from zero_lab.app.record.summary import SUMMARY_FILE, RunSummary

__all__ = [
    "WORLD_KEY",
    "Failed",
    "Repeat",
    "Run",
    "find_repeats",
    "find_runs",
    "label_runs",
    "parse_overrides",
    "percentile",
    "run_date",
]

WORLD_KEY = "dist.world_size"


@dataclass
class Run:
    """One complete run: its summary, its logged steps and how it was configured."""

    path: Path
    summary: RunSummary
    rows: list[dict[str, Any]]  # metrics.jsonl, one per logged step
    overrides: dict[str, str]
    config: dict[str, Any]
    meta: dict[str, Any]
    label: str = ""
    series: str = ""  # the label without the world size: one line per series in "vs W" plots

    @property
    def world_size(self) -> int:
        return int(self.summary.world_size)

    @property
    def losses(self) -> list[float]:
        return [float(x) for x in self.summary.losses]

    def per_rank(self, key: str) -> list[float] | None:
        """A per-rank list of the summary (:data:`zero_lab.app.record.catalogue.SUMMARY_LISTS`), else ``None``."""
        values = getattr(self.summary, key)
        return [float(v) for v in values] if values else None

    def per_step(self, key: str) -> list[float]:
        """``key`` of every logged step but the first (it pays one-off allocation costs)."""
        timed = self.rows[1:] or self.rows
        return [float(r[key]) for r in timed if r.get(key) is not None]

    def median(self, key: str) -> float | None:
        values = self.per_step(key)
        return statistics.median(values) if values else None


@dataclass
class Failed:
    """A run dir without a complete summary, and why."""

    path: Path
    reason: str
    overrides: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    label: str = ""


@dataclass
class Repeat:
    """A sweep job that was not run: it trains what ``original`` trained (``not_used``: its
    overrides the optimizer ignores); ``label``: the label of the run it repeats."""

    path: Path
    original: Path
    not_used: list[str]
    label: str = ""


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-quantile (0..1) of ``values`` (non-empty)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def parse_overrides(lines: list[str]) -> dict[str, str]:
    """``["optim=adam", "+x.y=1", "~z"]`` -> ``{"optim": "adam", "x.y": "1", "z": "<deleted>"}``;
    Hydra's own keys (``hydra.*``) are left out: they place a run, they don't configure it."""
    out: dict[str, str] = {}
    for line in lines:
        try:
            (override,) = read([line])
        except OverrideParseException:  # a hand-edited file: the line is its own label
            out[str(line)] = "<unparsed>"
            continue
        if override.root != "hydra":
            out[override.key] = "<deleted>" if override.value is None else override.value
    return out


def find_runs(root: Path) -> tuple[list[Run], list[Failed]]:
    """Every run dir below ``root`` (``root`` itself may be one), complete or not, labelled."""
    runs: list[Run] = []
    failed: list[Failed] = []
    for path in _run_dirs(root):
        if read_repeat(path) is not None:
            continue  # no run of its own: find_repeats
        loaded = _load(path)
        (runs if isinstance(loaded, Run) else failed).append(loaded)
    label_runs([*runs, *failed], root)
    runs.sort(key=lambda r: (r.series, r.world_size, r.label))
    failed.sort(key=lambda f: str(f.path))
    return runs, failed


def find_repeats(root: Path, runs: list[Run]) -> list[Repeat]:
    """The sweep jobs below ``root`` that repeated an earlier job and were not run, each with the
    label of the run it repeats (its dir, when that run is not among ``runs``)."""
    labels = {run.path.resolve(): run.label for run in runs}
    found = []
    for path in _run_dirs(root):
        record = read_repeat(path)
        if record is None:
            continue
        original = Path(str(record["repeat_of"]))
        label = labels.get(original.resolve(), str(original))
        found.append(Repeat(path, original, [str(o) for o in record.get("not_used") or []], label))
    return found


def _is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in (META_FILE, ".hydra", SUMMARY_FILE))


def _run_dirs(root: Path) -> list[Path]:
    if _is_run_dir(root):
        return [root]
    found: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink() and not child.name.startswith("."):
            found += _run_dirs(child)
    return found


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl; a torn last line (a killed run) is skipped."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _load(path: Path) -> Run | Failed:
    meta = _read_json(path / META_FILE) or {}
    lines = _read_yaml(path / ".hydra" / "overrides.yaml")
    overrides = parse_overrides(lines if isinstance(lines, list) else meta.get("overrides", []))
    config = _read_yaml(path / ".hydra" / "config.yaml") or {}
    summary = _read_json(path / SUMMARY_FILE)
    rows = _read_rows(path / METRICS_FILE)
    reason = _why_incomplete(path, summary, rows, config)
    if reason is not None:
        return Failed(path, reason, overrides, config, meta)
    return Run(path, RunSummary.from_dict(summary), rows, overrides, config, meta)


def _why_incomplete(path: Path, summary: Any, rows: list[dict[str, Any]], config: dict[str, Any]) -> str | None:
    """``None`` for a complete run, else what the run dir says went wrong."""
    steps = config.get("steps", "?")
    if isinstance(summary, dict) and summary.get("losses"):
        done, wanted = len(summary["losses"]), int(summary.get("steps", steps if steps != "?" else 0))
        if summary.get("stopped_by"):
            return f"stopped by {summary['stopped_by']} after {done} of {wanted} steps"
        if done < wanted:
            return f"incomplete: {done} of {wanted} steps"
        return None
    for error in sorted((path / LOGS_DIR).glob("rank*.error.txt")):
        rank = error.name.removeprefix("rank").removesuffix(".error.txt")
        return f"rank {rank} failed: {_exception_line(error.read_text(encoding='utf-8', errors='replace'))}"
    if rows:
        return f"no summary.json: {len(rows)} of {steps} steps logged, then it ended (killed?)"
    last_error = _last_error_line(path / "train.log")
    if last_error:
        return f"no metrics: {last_error}"
    return "no summary.json and no metrics: the job never started training (or is still starting)"


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*")


def _exception_line(traceback: str) -> str:
    """The traceback's last ``SomeError: message`` line (its last line if none), ≤ 300 chars
    (a longer one is cut and ends in ``…``)."""
    lines = [line.strip() for line in traceback.splitlines() if line.strip()]
    found = [line for line in lines if _EXCEPTION.match(line)]
    line = (found or lines or ["no details"])[-1]
    return line if len(line) <= 300 else line[:299] + "…"


def _last_error_line(log: Path) -> str | None:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    errors = [line for line in lines if "ERROR" in line or "Error" in line]
    return errors[-1].strip()[-300:] if errors else None


_ABSENT = object()


def _dotted(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _value(run: Run | Failed, key: str) -> str:
    """The run's value of ``key``: its override, else its group choice, else its config's;
    booleans as the command line writes them (a ``-m`` sweep saves ``true`` as ``True``)."""
    if key in run.overrides:
        value = run.overrides[key]
        return value.lower() if value in ("True", "False") else value
    choice = (run.meta.get("choices") or {}).get(key)
    if choice is not None:
        return str(choice)
    value = _dotted(run.config, key)
    if value is _ABSENT:
        return "default"
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()  # as Hydra's command line writes them
    return str(value)


def label_runs(runs: list[Run | Failed], root: Path) -> None:
    """Set ``label`` (and ``series``, the label without the world size) on every run."""
    keys = sorted({key for run in runs for key in run.overrides})
    differing = [key for key in keys if len({_value(run, key) for run in runs}) > 1]
    for run in runs:
        parts = [f"{key}={_value(run, key)}" for key in differing]
        run.label = " ".join(parts)
        if isinstance(run, Run):
            run.series = " ".join(p for p in parts if not p.startswith(f"{WORLD_KEY}=")) or "all runs"
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.label] = counts.get(run.label, 0) + 1
    for run in runs:
        duplicate = counts[run.label] > 1  # the same overrides: the dir tells them apart
        if duplicate or not run.label:
            where = run.path.relative_to(root).as_posix() if run.path != root else run.path.name
            run.label = f"{run.label} [{where}]".strip() if run.label else where
            if duplicate and isinstance(run, Run):
                run.series = f"{run.series} [{where}]"


def run_date(run: Run | Failed) -> datetime | None:
    """When the job started: the time ``meta.json`` (else the dir) was written, in UTC."""
    for path in (run.path / META_FILE, run.path):
        if path.exists():
            return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    return None
