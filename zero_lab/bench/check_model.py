"""``python scripts/check_model.py``: the step model's predictions beside runs on this machine.

For every model, world size and strategy it runs the benchmark library's worlds
(:func:`zero_lab.bench.run.plan_world_size`: a memory world whose one profiled iteration counts
every collective's bytes — DDP's all-reduce, zero_lab's gradient hook and exchange alike — then
:func:`~zero_lab.bench.run.time_world_size`: a timing world that steps the strategies side by
side, ``--repeats R`` times, round-robin over the world sizes — W = 1, 2, 4, 1, 2, 4, ... — so
the machine's drift meets every configuration alike) and prices the same step with
:func:`zero_lab.step_model.predict_step` on a hardware profile (default ``gloo_local``, this
machine's Gloo as ``scripts/calibrate.py`` fitted it) and
:func:`zero_lab.step_model.communicator_bytes`. Prints (and writes, ``--out``) a Markdown table:
predicted and measured step time (the slowest rank's median iteration) and bytes per step (rank
0's, the Communicator's convention), with the errors — the issue's bars are ±20 % for time and
±2 % for bytes. A row keeps every repeat's step time (``measured_runs``); its measured time is
their median, the time error is against it, and the table shows the band (min–max) beside it.
``--calibrate`` fits the profile first, in the same command (:mod:`zero_lab.bench.calibrate`,
written to ``DIR/profile.yaml`` beside the rows), so the fit and the check see the same machine.
``zl_gr_rs_bc_s2`` is the hierarchical row (2 × 2: ``shard_size=2`` at W=4), run
only where it is hierarchical; its gradient bytes are zero_lab's own count (the profiler does not
follow the hook's worker thread, where the replica all-reduce is issued). ``--out DIR`` writes
``model_check.md`` (the table), ``model_check.json`` (the rows, :func:`read_checks` reads them
back) and ``model_check.png`` (:func:`zero_lab.report.model_plots.plot_model_check`, its title
saying "idle" or "under load")::

    python scripts/check_model.py                                     # W = 1 2 4, both models, 20 steps, 3 repeats
    python scripts/check_model.py --calibrate --out outputs/check-model   # fit gloo_local here first, then check
    python scripts/check_model.py --world-sizes 2 --steps 3 --warmup 1 --models linear768
    python scripts/check_model.py --out outputs/check-model                 # + .md, .json, .png there
    python scripts/check_model.py --from docs/data/model-check-2026-11-27-idle.json   # re-price, run nothing

``--from JSON`` runs nothing: it re-prices a stored ``model_check.json``'s rows with the model and
profile as they are now (:func:`recheck`), the measured figures kept. Times depend on the load:
the header carries the load average, and a figure taken with other jobs running is "under load".
Bytes do not. Rows written before the repeats (no ``measured_runs``) read back with an empty band.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zero_lab.bench import calibrate
from zero_lab.bench.hardware import OLD_P2P_NOTE, load_hardware, profile_names
from zero_lab.bench.render import error_percent, markdown_table
from zero_lab.bench.run import Settings, plan_world_size, time_world_size
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.bench.strategies import STRATEGIES as BENCH
from zero_lab.bench.workloads import MODELS
from zero_lab.collective_cost import Hardware
from zero_lab.files import write_atomic
from zero_lab.partition import Flat, ParamSpec, SortedGreedy
from zero_lab.planner import specs_from_module
from zero_lab.report.model_plots import plot_model_check
from zero_lab.step_model import P2P_REDUCE_SCATTER, ModeledStrategy, communicator_bytes, predict_step
from zero_lab.step_model import STRATEGIES as AT_SCALE

__all__ = [
    "CHECKED",
    "SAMPLES",
    "Check",
    "checks_for",
    "combine",
    "format_checks",
    "main",
    "read_checks",
    "recheck",
    "strategies_at",
    "write_checks",
]

#: Rows each benchmark model's forward sees per step (its ``batch``): the step model's samples.
SAMPLES = {"tutorial": 20, "tutorial-quick": 20, "linear768": 16, "tiny": 4}

#: The benchmark strategies checked, each as the step model prices it on Gloo. ``zl_sg_bv``'s
#: exchange is ``auto``: its prediction takes the collective the run chose (its report).
CHECKED: dict[str, ModeledStrategy] = {
    "ddp": AT_SCALE["ddp"],
    "zl_flat_bv_bc": ModeledStrategy("zl_flat_bv_bc", "flat, broadcast", Flat, exchange="broadcast"),
    "zl_flat_bv_ag": ModeledStrategy("zl_flat_bv_ag", "flat, all_gather", Flat, exchange="all_gather"),
    "zl_sg_bv": ModeledStrategy("zl_sg_bv", "sorted_greedy, bucket view, auto", SortedGreedy, exchange="broadcast"),
    "zl_gr_rs_bc": ModeledStrategy(
        "zl_gr_rs_bc", "flat, p2p reduce-scatter, broadcast", Flat, grad_reduce="reduce_scatter", exchange="broadcast"
    ),
    "zl_gr_rs_bc_s2": ModeledStrategy(
        "zl_gr_rs_bc_s2",
        "flat, p2p reduce-scatter, broadcast, shard_size=2",
        Flat,
        grad_reduce="reduce_scatter",
        exchange="broadcast",
    ),
}


@dataclass(frozen=True)
class Check:
    """One (model, W, S, strategy): predicted and measured seconds and bytes per step.

    ``measured_runs``: every repeat's step time (each the slowest rank's median iteration of one
    timing world); ``measured_s`` is their median. Empty in rows written before the repeats."""

    model: str
    world_size: int
    shard_size: int
    strategy: str
    predicted_s: float
    measured_s: float | None
    predicted_bytes: int
    measured_bytes: int | None
    exchange: str
    measured_runs: tuple[float, ...] = ()

    @property
    def band(self) -> tuple[float, float] | None:
        """The fastest and slowest repeat's step time (``None`` without repeats)."""
        return (min(self.measured_runs), max(self.measured_runs)) if self.measured_runs else None

    @staticmethod
    def error(predicted: float, measured: float | None) -> float | None:
        return None if not measured else (predicted - measured) / measured

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Check:
        """The inverse of :meth:`as_dict` (fields with a default may be absent: older rows); a
        ``ValueError`` naming the fields missing or unknown."""
        fields = dataclasses.fields(cls)
        names = {f.name for f in fields}
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        if not required <= set(record) <= names:
            raise ValueError(
                f"a model-check row needs the fields {sorted(required)} (optional: {sorted(names - required)}): "
                f"missing {sorted(required - set(record))}, unknown {sorted(set(record) - names)}; "
                "write it with write_checks"
            )
        return cls(**{**record, "measured_runs": tuple(record.get("measured_runs", ()))})


def write_checks(path: str | Path, checks: Sequence[Check], header: str) -> Path:
    """``{"header": ..., "checks": [row, ...]}`` as JSON at ``path`` (atomically)."""
    payload = json.dumps({"header": header, "checks": [c.as_dict() for c in checks]}, indent=1)
    return write_atomic(path, lambda f: f.write(payload.encode("utf-8")))


def read_checks(path: str | Path) -> tuple[str, list[Check]]:
    """The header and rows :func:`write_checks` wrote."""
    record = json.loads(Path(path).read_text())
    return record["header"], [Check.from_dict(row) for row in record["checks"]]


def _as_run(strategy: ModeledStrategy, report: dict[str, Any] | None) -> ModeledStrategy:
    """``strategy`` with the exchange collective the run reports (``exchange="auto"`` decides per world)."""
    collective = (report or {}).get("collective")
    if strategy.partitioner is None or collective not in ("broadcast", "all_gather"):
        return strategy
    return ModeledStrategy(strategy.name, strategy.label, strategy.partitioner, strategy.grad_reduce, collective)


def _measured_bytes(counted: dict[str, Any]) -> int:
    """The profiler's gradient and parameter bytes; for the gradients, zero_lab's own meter where the
    profiler misses part of them (``grad_reduce_own``: the replica all-reduce of a hierarchical row)."""
    grads = counted.get("grad_reduce_own") or counted.get("grads") or {}
    return grads.get("bytes", 0) + (counted.get("params") or {}).get("bytes", 0)


def _specs(model: str) -> list[ParamSpec]:
    with torch.device("meta"):
        return specs_from_module(MODELS[model].build())


def _predicted(
    specs: list[ParamSpec], model: str, strategy: ModeledStrategy, world: int, shard: int, hardware: Hardware
) -> tuple[float, int]:
    """The step model's seconds and rank 0's bytes (the Communicator's convention) for one row."""
    prediction = predict_step(specs, strategy, hardware, world, SAMPLES[model], shard)
    counts = communicator_bytes(specs, strategy, world, 0, shard)
    return prediction.seconds, sum(payload for payload, _ in counts.values())


def checks_for(run: dict[str, Any], hardware: Hardware) -> list[Check]:
    """Predicted beside measured for one benchmark run (one model at one world size)."""
    specs = _specs(run["model"])
    world, out = run["world_size"], []
    for name, result in run["results"].items():
        if name not in CHECKED:
            continue
        strategy = _as_run(CHECKED[name], result.get("report"))
        shard = BENCH[name].shard_at(world)
        seconds, nbytes = _predicted(specs, run["model"], strategy, world, shard, hardware)
        steps = result.get("steps") or []
        measured_s = statistics.median(s["iter_s"] for s in steps) if steps else None
        counted = result.get("collectives") or {}
        measured_bytes = _measured_bytes(counted) if counted else None
        out.append(
            Check(run["model"], world, shard, name, seconds, measured_s, nbytes, measured_bytes, strategy.exchange)
        )
    return out


def combine(repeats: Sequence[Sequence[Check]]) -> list[Check]:
    """One row per configuration from the rows of every repeat: the first repeat's row (its
    prediction and bytes; the bytes come from the one memory world), every repeat's measured time
    in ``measured_runs`` (in repeat order, repeats that measured none left out) and their median as
    ``measured_s``. A configuration is (model, W, S, strategy)."""
    runs: dict[tuple[str, int, int, str], list[float]] = {}
    first: dict[tuple[str, int, int, str], Check] = {}
    for rows in repeats:
        for c in rows:
            key = (c.model, c.world_size, c.shard_size, c.strategy)
            first.setdefault(key, c)
            runs.setdefault(key, [])
            if c.measured_s is not None:
                runs[key].append(c.measured_s)
    return [
        dataclasses.replace(
            c, measured_s=statistics.median(runs[key]) if runs[key] else None, measured_runs=tuple(runs[key])
        )
        for key, c in first.items()
    ]


def recheck(checks: Sequence[Check], hardware: Hardware) -> list[Check]:
    """The rows of a stored check with the step model's predictions recomputed (the measured
    figures kept): what a change to the model or the profile does, without running anything."""
    specs = {model: _specs(model) for model in dict.fromkeys(c.model for c in checks)}
    out = []
    for c in checks:
        base = CHECKED[c.strategy]
        strategy = _as_run(base, {"collective": c.exchange}) if base.partitioner else base
        seconds, nbytes = _predicted(specs[c.model], c.model, strategy, c.world_size, c.shard_size, hardware)
        out.append(dataclasses.replace(c, predicted_s=seconds, predicted_bytes=nbytes))
    return out


def format_checks(checks: Sequence[Check]) -> str:
    """The Markdown table of docs/benchmarks.md."""
    titles = ["model", "W", "S", "strategy", "exchange", "predicted ms", "measured ms", "band ms", "time error"]
    titles += ["predicted MiB", "measured MiB", "bytes error"]
    rows = [
        (
            c.model,
            c.world_size,
            c.shard_size,
            c.strategy,
            c.exchange,
            f"{c.predicted_s * 1e3:,.1f}",
            "—" if c.measured_s is None else f"{c.measured_s * 1e3:,.1f}",
            "—" if c.band is None else f"{c.band[0] * 1e3:,.1f}–{c.band[1] * 1e3:,.1f}",
            error_percent(c.predicted_s, c.measured_s),
            f"{c.predicted_bytes / 2**20:,.3f}",
            "—" if c.measured_bytes is None else f"{c.measured_bytes / 2**20:,.3f}",
            error_percent(c.predicted_bytes, c.measured_bytes),
        )
        for c in checks
    ]
    return markdown_table(titles, "lrrllrrrrrrr", rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--hardware", help=f"a profile ({', '.join(profile_names())}) or path; default gloo_local, or --calibrate's"
    )
    parser.add_argument("--models", nargs="+", default=["tutorial-quick", "linear768"], choices=sorted(SAMPLES))
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=list(CHECKED), choices=list(CHECKED))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timing worlds per configuration, round-robin; the median is checked"
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="fit the profile first (scripts/calibrate.py, defaults), written to DIR/profile.yaml; needs --out",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="also write model_check.md (the table), .json (the rows) and .png here"
    )
    parser.add_argument(
        "--from",
        dest="stored",
        type=Path,
        metavar="JSON",
        help="run nothing: re-price the rows of a stored model_check.json (its measured figures kept)",
    )
    args = parser.parse_args(argv)
    if args.calibrate and (args.hardware or args.stored or not args.out):
        parser.error("--calibrate fits the profile itself: give --out DIR (it goes there), no --hardware or --from")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    return args


def strategies_at(strategies: Sequence[str], world_size: int) -> tuple[str, ...]:
    """``strategies`` less the hierarchical ones that are not hierarchical at ``world_size``
    (``zl_gr_rs_bc_s2`` runs where 2 < W and 2 divides W: elsewhere it would repeat ``zl_gr_rs_bc``)."""
    return tuple(n for n in strategies if BENCH[n].shard_size is None or BENCH[n].shard_at(world_size) < world_size)


#: A load average (before the runs, other jobs only) from which the figures are "under load".
LOADED = 1.0


def _measure(
    args: argparse.Namespace, hardware: Hardware, command: str, before: float
) -> tuple[list[Check], str, str, float]:
    """Run the worlds and check each; the rows, the table's header, "idle" or "under load", the load before.

    ``before``: the load average before this command ran anything (``--calibrate``'s own worlds
    raise it). Every world size's memory world first (the bytes, the timing plan), then
    ``args.repeats`` rounds of one timing world per world size, in the order of ``--world-sizes``."""
    settings = {
        w: Settings(tuple(args.models), (), strategies_at(args.strategies, w), args.warmup, args.steps)
        for w in args.world_sizes
    }
    planned = {w: plan_world_size(settings[w], w) for w in args.world_sizes}
    repeats = []
    for _ in range(args.repeats):
        rows = []
        for world in args.world_sizes:
            for run in time_world_size(settings[world], planned[world]):
                rows += checks_for(run, hardware)
        repeats.append(rows)
    checks = combine(repeats)
    load = os.getloadavg()[0]
    state = "under load" if before >= LOADED else "idle"
    header = (
        f"`{command}` — profile {hardware.name}{' (fitted by this command first)' if args.calibrate else ''}; "
        f"{args.repeats} timing worlds per configuration, round-robin "
        f"(the median checked, the band min–max); load average {before:.1f} before the runs ({state}), "
        f"{load:.1f} at the end, on {os.cpu_count()} cores"
    )
    return checks, header, state, before


def main(argv: Sequence[str] | None = None) -> list[Check]:
    args = parse_args(argv)
    command = command_line("scripts/check_model.py", argv)
    before = os.getloadavg()[0]
    profile = args.hardware or "gloo_local"
    if args.calibrate:  # the fit and the check on the same machine, minutes apart
        profile = str(args.out / "profile.yaml")
        calibrate.main(["--out", profile])
    hardware = load_hardware(profile)
    if args.stored:
        stored_header, stored = read_checks(args.stored)
        checks = recheck(stored, hardware)
        header = f"`{command}` — profile {hardware.name}, predictions re-priced; measured: {stored_header}"
        state, before = f"measured as in {args.stored.name}, re-priced", None
    else:
        checks, header, state, before = _measure(args, hardware, command, before)
    if hardware.sources.get(P2P_REDUCE_SCATTER) == OLD_P2P_NOTE:
        header += f"; the profile has no {P2P_REDUCE_SCATTER} fit: {OLD_P2P_NOTE}"
    text = header + "\n\n" + format_checks(checks) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out / "model_check.md", lambda f: f.write(text.encode("utf-8")))
        write_checks(args.out / "model_check.json", checks, header)
        worlds = "/".join(map(str, dict.fromkeys(c.world_size for c in checks)))
        when = "" if before is None else f" (load average {before:.1f} before the runs, {os.cpu_count()} cores)"
        title = f"Step model ({hardware.name}) vs runs here, W = {worlds}: {state}{when}"
        figure = plot_model_check([c.as_dict() for c in checks], args.out / "model_check.png", title)
        fitted = ", profile.yaml (the fitted profile)" if args.calibrate else ""
        print(f"written: {args.out}/model_check.md, model_check.json{fitted}, {figure}")
    return checks
