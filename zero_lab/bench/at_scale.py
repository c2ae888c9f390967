"""Step time per phase and memory per rank at 8 to 1,024 ranks: the step model and the planner, one table.

``python scripts/plan.py --hardware h100_ib --model gpt2-xl tutorial --world-size 8 64 512 1024
--shard-size 1 8`` (``--shard-size`` values beyond W are dropped; W itself is always priced). For
every model, W and S (``S`` = the group the state is sharded over, :mod:`zero_lab.step_model`):
one row per strategy with the exposed time of each phase, the step, the memory the fullest rank
holds (:func:`zero_lab.planner.plan_memory` on the same partition), the bus bytes per rank on
each link class and the partition's imbalance. Then :func:`crossings` says where the choices
cross: the fastest S per strategy and W, where a smaller S beats S = W, and where
``sorted_greedy``'s imbalance costs more than ``flat``.

The models are built on the ``meta`` device (no memory); ``--samples-per-rank`` is the tokens (or
rows) each rank's forward sees per step (defaults: :data:`SAMPLES`). Muon rows route the hidden
matrices to Muon and the rest to AdamW (:func:`zero_lab.routing.route_to_muon`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zero_lab.bench.render import markdown_table
from zero_lab.collective_cost import Hardware
from zero_lab.partition import ParamSpec
from zero_lab.planner import plan_memory
from zero_lab.routing import route_to_muon
from zero_lab.step_model import STRATEGIES, ModeledStrategy, StepPrediction, predict_step

__all__ = ["SAMPLES", "Row", "crossings", "format_rows", "format_summary", "model_specs", "rows_for"]

#: Tokens (LMs: sequences × length) or rows (MLPs) per rank per step, by model, unless given.
SAMPLES = {"tutorial": 20, "tutorial-quick": 20, "linear768": 16, "lm": 128, "gpt2": 8 * 1024, "gpt2-xl": 8 * 1024}
GIB = 2**30


@dataclass(frozen=True)
class Row:
    """One strategy at one (W, S): the prediction and the fullest rank's bytes."""

    model: str
    prediction: StepPrediction
    memory_bytes: int
    state_bytes: int

    def as_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "model": self.model,
            "strategy": p.strategy,
            "world_size": p.world_size,
            "shard_size": p.shard_size,
            "predicted_s": p.seconds,
            "phases": {ph.name: {"seconds": ph.seconds, "exposed_s": ph.exposed_s} for ph in p.phases},
            "intra_bytes": p.intra_bytes,
            "inter_bytes": p.inter_bytes,
            "memory_bytes": self.memory_bytes,
            "state_bytes": self.state_bytes,
            "imbalance": p.imbalance,
            "cost_imbalance": p.cost_imbalance,
        }


def model_specs(module: nn.Module, dtype: torch.dtype, muon: bool) -> list[ParamSpec]:
    """One spec per parameter in ``dtype``; with ``muon``, hidden matrices are Muon's (group 0,
    not elementwise) and the rest AdamW's (group 1)."""
    routes = route_to_muon(module) if muon else {}
    specs = []
    for name, param in module.named_parameters():
        to_muon = routes.get(name, False)
        specs.append(
            ParamSpec.of(
                param.to(dtype),
                name=name,
                group=0 if to_muon or not muon else 1,
                device="cpu",
                elementwise=not to_muon,
                stepper="Muon" if to_muon else "AdamW" if muon else "Adam",
            )
        )
    return specs


def _memory(specs: Sequence[ParamSpec], strategy: ModeledStrategy, shard: int, world: int) -> tuple[int, int]:
    partitioner = strategy.partitioner() if strategy.partitioner else None
    kwargs: dict[str, Any] = {"lr": 1e-3}
    if strategy.muon:
        kwargs = {"group_optimizers": [(torch.optim.Muon, {"lr": 1e-3}), (torch.optim.AdamW, {"lr": 1e-3})]}
    plan = plan_memory(
        specs,
        shard if partitioner else world,
        partitioner,
        torch.optim.AdamW if strategy.muon else torch.optim.Adam,
        release_grads=strategy.release_grads,
        gradient_as_bucket_view=strategy.release_grads,
        **kwargs,
    )
    summary = plan.summary()
    return int(summary["total_bytes"]["max"]), int(summary["state_bytes"]["max"])


def rows_for(
    model: str,
    module: nn.Module,
    hardware: Hardware,
    world_sizes: Sequence[int],
    shard_sizes: Sequence[int],
    strategies: Sequence[str],
    samples_per_rank: int,
    dtype: torch.dtype = torch.float32,
) -> list[Row]:
    """Every strategy at every W and every S that divides it (S = W always; S = 1 only for ZeRO rows)."""
    specs = {muon: model_specs(module, dtype, muon) for muon in (False, True)}
    out = []
    for world in world_sizes:
        shards = sorted({s for s in shard_sizes if s < world and world % s == 0} | {world})
        for name in strategies:
            strategy = STRATEGIES[name]
            for shard in [world] if strategy.partitioner is None else shards:
                chosen = specs[strategy.muon]
                prediction = predict_step(chosen, strategy, hardware, world, samples_per_rank, shard)
                memory, state = _memory(chosen, strategy, shard, world)
                out.append(Row(model, prediction, memory, state))
    return out


def format_rows(rows: Sequence[Row]) -> str:
    """A Markdown table: phases' exposed ms (gradient reduction and exchange: exposed / total)."""
    titles = ["W", "S", "strategy", "fwd+bwd ms", "grad copies + reduce ms", "step ms", "exchange ms"]
    titles += ["**step time ms**", "memory/rank GiB", "state/rank GiB", "intra GB/rank", "inter GB/rank", "imbalance"]
    cells = []
    for row in rows:
        p = row.prediction
        compute = (p.phase("forward").exposed_s + p.phase("backward").exposed_s) * 1e3
        grad, exchange, copies = p.phase("grad_reduce"), p.phase("exchange"), p.phase("grad_copies").seconds
        cells.append(
            (
                p.world_size,
                p.shard_size,
                p.strategy,
                f"{compute:,.1f}",
                f"{(copies + grad.exposed_s) * 1e3:,.1f} / {(copies + grad.seconds) * 1e3:,.1f}",
                f"{p.phase('step').exposed_s * 1e3:,.2f}",
                f"{exchange.exposed_s * 1e3:,.1f} / {exchange.seconds * 1e3:,.1f}",
                f"**{p.seconds * 1e3:,.1f}**",
                f"{row.memory_bytes / GIB:,.2f}",
                f"{row.state_bytes / GIB:,.3f}",
                f"{p.intra_bytes / 1e9:,.2f}",
                f"{p.inter_bytes / 1e9:,.2f}",
                f"{max(p.imbalance, p.cost_imbalance):.2f}",
            )
        )
    return markdown_table(titles, "rrlrrrrrrrrrr", cells)


def _shard_order(shard: str) -> float:
    return float("inf") if shard == "W" else int(shard)


def format_summary(rows: Sequence[Row]) -> str:
    """One line per strategy and S (``W``: S = W), one column per W: step ms · memory GiB per rank."""
    worlds = sorted({r.prediction.world_size for r in rows})
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for row in rows:
        p = row.prediction
        shard = "W" if p.shard_size == p.world_size else str(p.shard_size)
        cell = f"{p.seconds * 1e3:,.1f} · {row.memory_bytes / GIB:,.2f}"
        cells.setdefault((p.strategy, shard), {})[p.world_size] = cell
    order = {name: i for i, name in enumerate(dict.fromkeys(r.prediction.strategy for r in rows))}
    ordered = sorted(cells.items(), key=lambda kv: (order[kv[0][0]], _shard_order(kv[0][1])))
    lines = [(name, shard, *(by_world.get(w, "—") for w in worlds)) for (name, shard), by_world in ordered]
    return markdown_table(["strategy", "S", *(f"W={w}" for w in worlds)], "lr" + "r" * len(worlds), lines)


def crossings(rows: Sequence[Row]) -> list[str]:
    """Where the choices cross, in sentences: per strategy and W, the fastest sharded group
    ``1 < S < W`` when it beats S = W by more than 1 % (S = 1, no sharding, is DDP's traffic with
    the whole state on every rank: left out), and each W where ``sorted_greedy`` is slower than
    ``flat`` or holds more."""
    by_key = {(r.prediction.strategy, r.prediction.world_size, r.prediction.shard_size): r for r in rows}
    worlds = sorted({r.prediction.world_size for r in rows})
    lines = []
    for name in dict.fromkeys(r.prediction.strategy for r in rows):
        wins = []
        for world in worlds:
            options = [r for (s, w, shard), r in by_key.items() if s == name and w == world and shard > 1]
            if len(options) < 2:
                continue
            best = min(options, key=lambda r: r.prediction.seconds)
            full = by_key[(name, world, world)]
            if best.prediction.seconds < full.prediction.seconds / 1.01:
                gain = full.prediction.seconds / best.prediction.seconds
                state = best.state_bytes / max(full.state_bytes, 1)
                wins.append(
                    f"W={world}: S={best.prediction.shard_size} ({gain:.2f}× faster than S=W, {state:.1f}× its state)"
                )
        if wins:
            lines.append(f"{name}: a smaller group beats S = W (by > 1 %) at " + "; ".join(wins))
    for world in worlds:
        greedy, flat = by_key.get(("zero1_sorted_greedy", world, world)), by_key.get(("zero1_flat", world, world))
        if greedy is None or flat is None:
            continue
        slower = greedy.prediction.seconds / flat.prediction.seconds
        fuller = greedy.state_bytes / max(flat.state_bytes, 1)
        if slower > 1.01 or fuller > 1.01:
            lines.append(
                f"W={world}: sorted_greedy's imbalance ({greedy.prediction.imbalance:.2f}) costs {slower:.2f}× flat's "
                f"step time and {fuller:.2f}× its optimizer state per rank"
            )
    return lines
