"""Run the benchmark: per world size, a memory world, then timing rounds planned from it.

:func:`run_world_size` starts two worlds of ``world_size`` ranks (one process and one
thread per rank, Gloo; :func:`plan_world_size` and :func:`time_world_size` each): the memory
phase for every model, then the timing rounds,
whose composition follows the *measured* peaks of the memory phase (rounds hold all
strategies when their peaks fit in ``memory_budget`` of the machine's available
memory, else as many as fit, always with each strategy's reference). With more ranks
than cores, timing runs only if one round holds everything, and its times are
oversubscribed. :func:`summarize_run` turns the ranks' records into one model's tables.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from zero_lab.bench import host
from zero_lab.bench.rank import RankJob, bench_rank, collectives_rank
from zero_lab.bench.rounds import plan_rounds, strategy_cost_bytes
from zero_lab.bench.strategies import STRATEGIES, deepspeed_status, fairscale_status
from zero_lab.bench.summary import merge_ranks, planned_state, summarize
from zero_lab.bench.workloads import MODELS
from zero_lab.runtime.spawn import run_world

__all__ = [
    "Planned",
    "Settings",
    "check_collectives",
    "machine",
    "plan_world_size",
    "run_world_size",
    "summarize_run",
    "time_world_size",
]

Plan = tuple[list[list[str]], dict[str, int], str]


@dataclass(frozen=True)
class Settings:
    """How one benchmark invocation runs (the CLI's arguments)."""

    models: tuple[str, ...]
    world_sizes: tuple[int, ...]
    strategies: tuple[str, ...]
    warmup: int = 2
    steps: int = 20
    memory_budget: float = 0.6
    start_method: str = "forkserver"
    timeout: float = 7200.0


def machine() -> dict[str, Any]:
    """Where the figures come from: versions, cores, free memory, git revision."""
    ok, fairscale = fairscale_status()
    ds_ok, ds = deepspeed_status()
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        revision = ""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "mem_available_gib": host.available_bytes() / 2**30,
        "fairscale": fairscale,
        "fairscale_ok": ok,
        "deepspeed": ds,
        "deepspeed_ok": ds_ok,
        "git_revision": revision,
        "backend": "gloo",
        "threads_per_rank": 1,
    }


def _planned_need(model_name: str, world_size: int, strategies: Sequence[str]) -> dict[str, int]:
    """Bytes per rank to have free before the memory phase builds each strategy (planner × 1.5)."""
    return {n: 3 * strategy_cost_bytes(model_name, n, world_size) // 2 for n in strategies}


def schedule(settings: Settings, world_size: int, measured: dict[str, list[dict[str, Any] | None]]) -> Plan:
    """Timing rounds for one model from the *measured* peaks of the memory phase.

    A strategy's cost is the sum over ranks of its peak RSS Δ (everything it added,
    transients included, so the sum over a round over-counts transients: margin for
    the allocator). Returns the rounds, each strategy's per-rank need, and a note.
    """
    cost = {n: sum(m["peak_rss_delta_bytes"] or 0 for m in ranks) for n, ranks in measured.items() if None not in ranks}
    names = list(cost)
    need = {n: max(m["peak_rss_delta_bytes"] or 0 for m in measured[n]) for n in names}
    resident = max((sum(m["rss_base_bytes"] for m in measured[n]) for n in names), default=0)  # runtime + template
    budget = int(settings.memory_budget * host.available_bytes()) - resident
    rounds, dropped = plan_rounds(names, cost.__getitem__, budget)
    cores = os.cpu_count() or 1
    notes = [f"not measured (too little free memory then): {[n for n in measured if n not in cost]}"]
    if world_size > cores and len(rounds) > 1:
        notes.append(f"timing skipped: {world_size} ranks on {cores} cores would need {len(rounds)} rounds")
        rounds = []
    else:
        notes.append(f"left out of timing (memory): {dropped}")
        if world_size > cores:
            notes.append(f"{world_size} ranks share {cores} cores: times are oversubscribed, compare ratios only")
    return rounds, need, "; ".join(n for n in notes if not n.endswith("[]"))


@dataclass(frozen=True)
class Planned:
    """One world size's memory world: every rank's records and, per model, its timing plan."""

    world_size: int
    memory: list[dict[str, Any]]
    plans: dict[str, Plan]
    seconds: float


def _world(settings: Settings) -> dict[str, Any]:
    return {"timeout_s": settings.timeout, "deadline_s": settings.timeout + 30, "start_method": settings.start_method}


def _memory_job(settings: Settings, world_size: int) -> RankJob:
    need = {m: _planned_need(m, world_size, settings.strategies) for m in settings.models}
    return RankJob("memory", settings.models, settings.strategies, settings.warmup, settings.steps, need=need)


def plan_world_size(settings: Settings, world_size: int) -> Planned:
    """The memory world of ``world_size`` ranks (every model) and the timing rounds planned from it."""
    started = time.perf_counter()
    memory = run_world(bench_rank, world_size, (_memory_job(settings, world_size),), **_world(settings))
    plans = {}
    for model_name in settings.models:
        measured = {n: [r[model_name][n] for r in memory] for n in settings.strategies}
        plans[model_name] = schedule(settings, world_size, measured)
    return Planned(world_size, memory, plans, time.perf_counter() - started)


def time_world_size(settings: Settings, planned: Planned) -> list[dict[str, Any]]:
    """One timing world as ``planned`` says, each model's run summarised with the planned memory
    records (a timing world can run again on the same plan: the check's repeats)."""
    plans = planned.plans
    timing_job = replace(
        _memory_job(settings, planned.world_size),
        phase="timing",
        rounds={m: p[0] for m, p in plans.items()},
        need={m: p[1] for m, p in plans.items()},
    )
    started = time.perf_counter()
    timing = run_world(bench_rank, planned.world_size, (timing_job,), **_world(settings))
    elapsed = planned.seconds + time.perf_counter() - started
    return [
        summarize_run(model_name, planned.world_size, planned.memory, timing, plans[model_name], elapsed)
        for model_name in settings.models
    ]


def run_world_size(settings: Settings, world_size: int) -> list[dict[str, Any]]:
    """Two worlds for ``world_size``: memory (every model), then timing rounds planned from it."""
    return time_world_size(settings, plan_world_size(settings, world_size))


def summarize_run(
    model_name: str,
    world_size: int,
    memory: list[dict[str, Any]],
    timing: list[dict[str, Any]],
    plan: Plan,
    elapsed: float,
) -> dict[str, Any]:
    """One model at one world size: merged per-strategy results, the table, rounds and notes."""
    with torch.device("meta"):
        model = MODELS[model_name].build()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results = merge_ranks(memory, timing, model_name)
    rounds, _, note = plan
    skipped = sorted({n for r in (timing[0][model_name] if timing else []) for n in r["skipped"]})
    if skipped:
        note = "; ".join(filter(None, [note, f"skipped at build time (memory): {skipped}"]))
    run = {
        "model": model_name,
        "description": MODELS[model_name].description,
        "world_size": world_size,
        "model_numel": sum(p.numel() for p in model.parameters()),
        "model_bytes": model_bytes,
        "rounds": [r["strategies"] for r in timing[0][model_name] if r["strategies"]] if timing else rounds,
        "note": note,
        "world_seconds": elapsed,
        "results": results,
    }
    return tabulate(run)


def tabulate(run: dict[str, Any]) -> dict[str, Any]:
    """(Re)compute a run's table from its raw results (also for a saved run)."""
    names = [n for n in run["results"] if n in STRATEGIES]
    planned = planned_state(run["model"], run["world_size"], names)
    return run | {"table": summarize(run["results"], run["model_bytes"], planned)}


def check_collectives(models: Sequence[str], world_sizes: Sequence[int], repeats: int, start_method: str) -> list:
    """How long Gloo takes to move each model's bytes with each collective pattern (slowest rank)."""
    rows = []
    for model_name in models:
        with torch.device("meta"):
            sizes = [p.numel() for p in MODELS[model_name].build().parameters()]
        for world_size in world_sizes:
            times = run_world(collectives_rank, world_size, (sizes, repeats), start_method=start_method)
            worst = {k: max(t[k] for t in times) for k in times[0]}
            rows.append(
                {"model": model_name, "tensors": len(sizes), "mib": 4 * sum(sizes) / 2**20}
                | {
                    "world_size": world_size,
                    "ms": worst,
                }
            )
    return rows


def default_out(root: Path, mode: str) -> Path:
    return root / "outputs" / "bench" / f"bench-{mode}-{time.strftime('%Y%m%d-%H%M%S')}.json"
