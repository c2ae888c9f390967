"""``python scripts/check_model.py``: the step model's predictions beside runs on this machine.

For every model, world size and strategy it runs the benchmark library's worlds
(:func:`zero_lab.bench.run.run_world_size`: a memory world whose one profiled iteration counts
every collective's bytes — DDP's all-reduce, zero_lab's gradient hook and exchange alike — then
a timing world that steps the strategies side by side) and prices the same step with
:func:`zero_lab.step_model.predict_step` on a hardware profile (default ``gloo_local``, this
machine's Gloo as ``scripts/calibrate.py`` fitted it) and
:func:`zero_lab.step_model.communicator_bytes`. Prints (and writes, ``--out``) a Markdown table:
predicted and measured step time (the slowest rank's median iteration) and bytes per step (rank
0's, the Communicator's convention), with the errors — the issue's bars are ±20 % for time and
±2 % for bytes. ``zl_gr_rs_bc_s2`` is the hierarchical row (2 × 2: ``shard_size=2`` at W=4), run
only where it is hierarchical; its gradient bytes are zero_lab's own count (the profiler does not
follow the hook's worker thread, where the replica all-reduce is issued). ``--out DIR`` writes
``model_check.md`` (the table), ``model_check.json`` (the rows, :func:`read_checks` reads them
back) and ``model_check.png`` (:func:`zero_lab.report.model_plots.plot_model_check`, its title
saying "idle" or "under load")::

    python scripts/check_model.py                                     # W = 1 2 4, both models, 20 steps
    python scripts/check_model.py --world-sizes 2 --steps 3 --warmup 1 --models linear768
    python scripts/check_model.py --out outputs/check-model                 # + .md, .json, .png there
    python scripts/check_model.py --from docs/data/model-check-2026-11-27-idle.json   # re-price, run nothing

``--from JSON`` runs nothing: it re-prices a stored ``model_check.json``'s rows with the model and
profile as they are now (:func:`recheck`), the measured figures kept. Times depend on the load:
the header carries the load average, and a figure taken with other jobs running is "under load".
Bytes do not.
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

from zero_lab.bench.hardware import load_hardware, profile_names
from zero_lab.bench.render import error_percent, markdown_table
from zero_lab.bench.run import Settings, run_world_size
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.bench.strategies import STRATEGIES as BENCH
from zero_lab.bench.workloads import MODELS
from zero_lab.collective_cost import Hardware
from zero_lab.files import write_atomic
from zero_lab.partition import Flat, ParamSpec, SortedGreedy
from zero_lab.planner import specs_from_module
from zero_lab.report.model_plots import plot_model_check
from zero_lab.step_model import STRATEGIES as AT_SCALE
from zero_lab.step_model import ModeledStrategy, communicator_bytes, predict_step

__all__ = [
    "CHECKED",
    "SAMPLES",
    "Check",
    "checks_for",
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
    """One (model, W, S, strategy): predicted and measured seconds and bytes per step."""

    model: str
    world_size: int
    shard_size: int
    strategy: str
    predicted_s: float
    measured_s: float | None
    predicted_bytes: int
    measured_bytes: int | None
    exchange: str

    @staticmethod
    def error(predicted: float, measured: float | None) -> float | None:
        return None if not measured else (predicted - measured) / measured

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Check:
        """The inverse of :meth:`as_dict`; a ``ValueError`` naming the fields missing or unknown."""
        names = {f.name for f in dataclasses.fields(cls)}
        if set(record) != names:
            raise ValueError(
                f"a model-check row needs the fields {sorted(names)}: missing {sorted(names - set(record))}, "
                f"unknown {sorted(set(record) - names)}; write it with write_checks"
            )
        return cls(**record)


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
    titles = ["model", "W", "S", "strategy", "exchange", "predicted ms", "measured ms", "time error"]
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
            error_percent(c.predicted_s, c.measured_s),
            f"{c.predicted_bytes / 2**20:,.3f}",
            "—" if c.measured_bytes is None else f"{c.measured_bytes / 2**20:,.3f}",
            error_percent(c.predicted_bytes, c.measured_bytes),
        )
        for c in checks
    ]
    return markdown_table(titles, "lrrllrrrrrr", rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--hardware", default="gloo_local", help=f"a profile ({', '.join(profile_names())}) or path")
    parser.add_argument("--models", nargs="+", default=["tutorial-quick", "linear768"], choices=sorted(SAMPLES))
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=list(CHECKED), choices=list(CHECKED))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
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
    return parser.parse_args(argv)


def strategies_at(strategies: Sequence[str], world_size: int) -> tuple[str, ...]:
    """``strategies`` less the hierarchical ones that are not hierarchical at ``world_size``
    (``zl_gr_rs_bc_s2`` runs where 2 < W and 2 divides W: elsewhere it would repeat ``zl_gr_rs_bc``)."""
    return tuple(n for n in strategies if BENCH[n].shard_size is None or BENCH[n].shard_at(world_size) < world_size)


#: A load average (before the runs, other jobs only) from which the figures are "under load".
LOADED = 1.0


def _measure(args: argparse.Namespace, hardware: Hardware, command: str) -> tuple[list[Check], str, str, float]:
    """Run the worlds and check each; the rows, the table's header, "idle" or "under load", the load before."""
    before = os.getloadavg()[0]
    checks = []
    for world in args.world_sizes:
        chosen = strategies_at(args.strategies, world)
        settings = Settings(tuple(args.models), (), chosen, args.warmup, args.steps)
        for run in run_world_size(settings, world):
            checks += checks_for(run, hardware)
    load = os.getloadavg()[0]
    state = "under load" if before >= LOADED else "idle"
    header = (
        f"`{command}` — profile {hardware.name}; load average {before:.1f} before the runs ({state}), "
        f"{load:.1f} at the end, on {os.cpu_count()} cores"
    )
    return checks, header, state, before


def main(argv: Sequence[str] | None = None) -> list[Check]:
    args = parse_args(argv)
    hardware = load_hardware(args.hardware)
    command = command_line("scripts/check_model.py", argv)
    if args.stored:
        stored_header, stored = read_checks(args.stored)
        checks = recheck(stored, hardware)
        header = f"`{command}` — profile {hardware.name}, predictions re-priced; measured: {stored_header}"
        state, before = f"measured as in {args.stored.name}, re-priced", None
    else:
        checks, header, state, before = _measure(args, hardware, command)
    text = header + "\n\n" + format_checks(checks) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out / "model_check.md", lambda f: f.write(text.encode("utf-8")))
        write_checks(args.out / "model_check.json", checks, header)
        worlds = "/".join(map(str, dict.fromkeys(c.world_size for c in checks)))
        when = "" if before is None else f" (load average {before:.1f} before the runs, {os.cpu_count()} cores)"
        title = f"Step model ({hardware.name}) vs runs here, W = {worlds}: {state}{when}"
        figure = plot_model_check([c.as_dict() for c in checks], args.out / "model_check.png", title)
        print(f"written: {args.out}/model_check.md, model_check.json, {figure}")
    return checks
