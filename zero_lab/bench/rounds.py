"""Group strategies into timing rounds that fit the machine's memory (pure: no processes).

Strategies of one round are built side by side and stepped round-robin, so a ratio
between two of them is paired step by step. A round must therefore hold the reference
of every strategy in it; in order of preference it also holds ``ddp`` and whole
families (``zl_sg`` with ``zl_sg_bv``)::

    rounds, dropped = plan_rounds(["ddp", "torch", "zl_sg"], cost=lambda n: 1, budget=3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from zero_lab.bench.strategies import LR, STRATEGIES
from zero_lab.bench.workloads import MODELS
from zero_lab.planner import plan_memory, specs_from_module

__all__ = ["plan_rounds", "strategy_cost_bytes"]


def strategy_cost_bytes(model_name: str, name: str, world_size: int) -> int:
    """Planner estimate of one strategy's bytes on its worst rank (for the memory guard).

    Model copy + gradients + DDP buckets + optimizer state (strategies the planner does
    not know are priced as DDP: an upper bound), plus one model-sized transient for
    exchanges that stage through a fresh buffer.
    """
    with torch.device("meta"):
        model = MODELS[model_name].build()
    strategy = STRATEGIES[name]
    partitioner = strategy.partitioner() if strategy.partitioner else None
    plan = plan_memory(specs_from_module(model), world_size, partitioner, torch.optim.Adam, lr=LR)
    worst = max(plan.ranks, key=lambda r: r.total_bytes)
    return worst.total_bytes + (worst.param_bytes if strategy.transient else 0)


def _packing_units(names: Sequence[str]) -> list[list[str]]:
    """Families of the strategies to compare, zero_lab's first; references come with them."""
    referenced = {STRATEGIES[n].reference for n in names}
    compared = [n for n in names if n != "ddp" and n not in referenced]
    units: dict[str, list[str]] = {}
    for name in sorted(compared, key=lambda n: not STRATEGIES[n].zero_lab):
        units.setdefault(STRATEGIES[name].group, []).append(name)
    return list(units.values())


def _with_references(unit: Sequence[str], names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(m for n in unit for m in (STRATEGIES[n].reference, n) if m in names))


def _fill(
    units: Sequence[list[str]], start: list[str], names: Sequence[str], cost: Callable[[str], int], budget: int
) -> tuple[list[str], list[list[str]]]:
    """First-fit: add each unit (with its references) to ``start`` while the round fits."""
    current, left = list(start), []
    for unit in units:
        extra = [m for m in _with_references(unit, names) if m not in current]
        if sum(cost(n) for n in current + extra) <= budget:
            current += extra
        else:
            left.append(unit)
    return current, left


def plan_rounds(names: Sequence[str], cost: Callable[[str], int], budget: int) -> tuple[list[list[str]], list[str]]:
    """Group strategies into rounds whose summed ``cost`` fits ``budget``.

    Every round holds the reference of each strategy in it (a reference may run in
    several rounds), so every ratio to a reference is paired within a round. In order
    of preference a round also holds ``ddp``, and a whole family; when a family fits
    only without ``ddp`` it runs without it, and when it does not fit at all its members
    run one by one. Returns the rounds and the strategies that do not fit even alone
    with their reference.
    """
    base = ["ddp"] if "ddp" in names else []
    rounds: list[list[str]] = []
    dropped: list[str] = []
    pending = _packing_units(names)
    while pending:
        current, left = _fill(pending, base, names, cost, budget)
        if current == base:  # nothing fits beside ddp: the first family alone
            current, rest = _fill(pending[:1], [], names, cost, budget)
            left = rest + pending[1:]
        if current and current != base:
            rounds.append(current)
            pending = left
        elif len(pending[0]) > 1:  # the family does not fit together: its members one by one
            pending[0:1] = [[n] for n in pending[0]]
        else:
            dropped += pending.pop(0)
        if not pending:  # ddp if no round had room for it; baselines of dropped strategies
            placed = {n for r in rounds for n in r} | set(dropped)
            pending = [[n] for n in names if n not in placed]
            if pending == [base] and base:
                rounds.append(base) if cost(base[0]) <= budget else dropped.append(base[0])
                pending = []
    return rounds, dropped
