"""From the ranks' raw records to the figures of the tables (pure).

Per strategy: memory figures per rank (the tables show the worst rank), and per timed
step the slowest rank's record. Ratios are **medians of per-step ratios** between two
strategies of the same round (paired: both saw the same moment of machine noise);
strategies that never shared a round get the ratio of their medians, and the table
lists such ratios under ``unpaired`` (the tables mark them).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch

from zero_lab.bench.strategies import LR, STRATEGIES
from zero_lab.bench.workloads import MODELS
from zero_lab.planner import plan_memory, specs_from_module

__all__ = ["MIB", "common_rounds", "median_ms", "merge_ranks", "paired", "paired_ratio", "planned_state", "summarize"]

MIB = 2**20


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def merge_ranks(memory_ranks: list[dict[str, Any]], timing_ranks: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """Per strategy: per-rank memory figures, and per step the slowest rank's record.

    ``report`` (zero_lab's exchange report, rank 0) is the timing world's where the
    strategy was timed: ``exchange="auto"`` chooses anew in every world.
    """
    out: dict[str, Any] = {}
    memory = [r[model] for r in memory_ranks]
    for name in (n for n in memory[0] if memory[0][n] is not None):
        entry = {key: [m[name][key] for m in memory] for key in memory[0][name]}
        for same_on_all in ("imbalance", "report", "collectives"):
            entry[same_on_all] = memory[0][name][same_on_all]
        out[name] = entry
    for index, round_ in enumerate(timing_ranks[0][model] if timing_ranks else []):
        for name in round_["strategies"]:
            steps = [_slowest(step) for step in zip(*(r[model][index]["records"][name] for r in timing_ranks))]
            entry = out.setdefault(name, {})
            entry.setdefault("steps_by_round", {})[str(index)] = steps
            entry["steps"] = entry.get("steps", []) + steps
            entry["max_abs_diff_vs_ddp"] = round_["max_abs_diff_vs_ddp"][name]
            if name in round_["reports"]:  # the timing world's own choice (exchange=auto), as timed
                entry["report"] = round_["reports"][name]
    return out


def _slowest(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One step across ranks: the slowest rank's times; bytes and calls of rank 0 (equal on all)."""
    return {
        "iter_s": max(r["iter_s"] for r in records),
        "step_s": max(r["step_s"] for r in records),
        "exchange_s": max(r["step_s"] - r["local_s"] for r in records),
        "metered_s": max(r["metered_s"] for r in records),
        "exposed_s": max(r["exposed_s"] for r in records),
        "exchange_bytes": records[0]["exchange_bytes"],
        "exchange_calls": records[0]["exchange_calls"],
    }


def common_rounds(results: dict[str, Any], name: str, ref: str | None) -> list[str]:
    """The timing rounds (keys of ``steps_by_round``) both strategies ran in."""
    a, b = results.get(name, {}), results.get(ref or "", {})
    return sorted(set(a.get("steps_by_round", {})) & set(b.get("steps_by_round", {})))


def paired(results: dict[str, Any], name: str, ref: str | None) -> bool:
    """Whether ``name`` and ``ref`` were timed in the same round (so their ratio is paired)."""
    return bool(common_rounds(results, name, ref))


def paired_ratio(results: dict[str, Any], name: str, ref: str | None, key: str) -> float | None:
    """Median over steps of ``name[key] / ref[key]`` in a round both ran in; else ratio of medians."""
    a, b = results.get(name, {}), results.get(ref or "", {})
    if "steps" not in a or "steps" not in b:
        return None
    common = common_rounds(results, name, ref)
    if common:
        pairs = zip(a["steps_by_round"][common[0]], b["steps_by_round"][common[0]])
        return median([x[key] / y[key] for x, y in pairs if y[key] > 0])
    ma, mb = median([s[key] for s in a["steps"]]), median([s[key] for s in b["steps"]])
    return ma / mb if ma is not None and mb else None


def median_ms(steps: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over steps (steps without it skipped), in milliseconds."""
    value = median([s.get(key) for s in steps])
    return None if value is None else 1e3 * value


def _moved(name: str, r: dict[str, Any], kind: str, field: str) -> float | None:
    """Per-step exchange bytes or calls: zero_lab's own meter if it has one, else the profiler's."""
    if not STRATEGIES[name].sharded and kind == "params":
        return None
    if STRATEGIES[name].zero_lab and kind == "params" and r.get("steps"):
        return median([s.get(f"exchange_{field}") for s in r["steps"]])
    metered = r.get("collectives")
    return None if metered is None else metered[kind][field]


def summarize(results: dict[str, Any], model_bytes: int, planned: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """The figures of the printed tables, per strategy (memory: the worst rank)."""
    table = {}

    def worst(name: str | None, key: str) -> int | None:
        values = [v for v in results.get(name or "", {}).get(key, []) if v is not None]
        return max(values) if values else None

    ddp_state = worst("ddp", "state_bytes")
    for name, r in results.items():
        strategy = STRATEGIES[name]
        ref = strategy.reference
        vs_torch = ref is not None and ref.startswith("torch")
        state, ref_state, peak, tensors = (
            worst(name, "state_bytes"),
            worst(ref, "state_bytes"),
            worst(name, "peak_rss_delta_bytes"),
            worst(name, "tensor_bytes"),
        )
        steps = r.get("steps", [])
        iter_vs_torch = paired_ratio(results, name, ref, "iter_s") if vs_torch else None
        iter_vs_ddp = paired_ratio(results, name, "ddp", "iter_s") if name != "ddp" else None
        unpaired = [
            key
            for key, value, against in (("iter_vs_torch", iter_vs_torch, ref), ("iter_vs_ddp", iter_vs_ddp, "ddp"))
            if value is not None and not paired(results, name, against)
        ]
        param_bytes, grad_bytes = _moved(name, r, "params", "bytes"), _moved(name, r, "grads", "bytes")
        table[name] = {
            "state_mib": None if state is None else state / MIB,
            "state_vs_ddp": state / ddp_state if state is not None and ddp_state else None,
            "state_vs_torch": state / ref_state if state is not None and ref_state and vs_torch else None,
            "planned_state_ok": planned[name] == r["state_bytes"] if name in planned and "state_bytes" in r else None,
            "tensor_mib": None if tensors is None else tensors / MIB,
            "peak_rss_delta_mib": None if peak is None else peak / MIB,
            "imbalance": r.get("imbalance"),
            "iter_ms": median_ms(steps, "iter_s"),
            "iter_vs_torch": iter_vs_torch,
            "iter_vs_ddp": iter_vs_ddp,
            "exchange_ms": median_ms(steps, "exchange_s") if strategy.exchange_in_step else None,
            "collective_ms": median_ms(steps, "metered_s") if strategy.zero_lab else None,
            "exposed_ms": median_ms(steps, "exposed_s") if strategy.zero_lab else None,
            "bytes_vs_min": None if param_bytes is None else param_bytes / model_bytes,
            "calls_per_step": _moved(name, r, "params", "calls"),
            "grad_bytes_vs_min": None if grad_bytes is None else grad_bytes / model_bytes,
            "max_abs_diff_vs_ddp": r.get("max_abs_diff_vs_ddp"),
            "unpaired": unpaired,
        }
    return table


def planned_state(model_name: str, world_size: int, names: Sequence[str]) -> dict[str, list[int]]:
    """The planner's per-rank state bytes, for strategies whose partition it knows."""
    with torch.device("meta"):
        model = MODELS[model_name].build()
    specs = specs_from_module(model)
    out = {}
    for name in names:
        strategy = STRATEGIES[name]
        if strategy.planned:
            partitioner = strategy.partitioner() if strategy.partitioner else None
            plan = plan_memory(specs, world_size, partitioner, torch.optim.Adam, lr=LR)
            out[name] = [r.state_bytes for r in plan.ranks]
    return out
