"""Which of the report's timing comparisons are within step-to-step noise.

A timing in the table is a median over the run's timed steps (every logged step but the
first). Its *band* is the 10th–90th percentile of the same per-step values. For each timed
measure (:data:`MEASURES`) and each world size, the runs are sorted by the low end of their
band and chained while each band overlaps the reach of the ones before it (the interval
sweep for overlapping ranges); a chain of two or more runs is a comparison the report
cannot call: the medians differ by less than the steps scatter. Each such chain becomes one
note line, with every run's median and band, so a reader does not rank runs by noise
(e.g. ``partitioner.cost=numel`` vs ``newton_schulz`` on a loaded machine).

    for line in noise_notes(runs):
        print(line)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from zero_lab.app.record.catalogue import OPTIM_STEP_S, STEP_S
from zero_lab.report.runs import Run, percentile
from zero_lab.report.table import format_ms

__all__ = ["MEASURES", "Band", "Measure", "band", "noise_notes"]


@dataclass(frozen=True)
class Band:
    """A run's median of a per-step measure and its 10th–90th percentile."""

    median: float
    low: float
    high: float


@dataclass(frozen=True)
class Measure:
    """A per-step timing the table shows as a median: its column, values, and how to print one."""

    column: str
    values: Callable[[Run], list[float]]
    text: Callable[[float], str]


def _ratio_per_step(run: Run) -> list[float]:
    """Slowest rank's local optimizer step ÷ the mean, step by step (as ``slowest ÷ mean``)."""
    high, mean = OPTIM_STEP_S.at("max"), OPTIM_STEP_S.at("mean")
    timed = run.rows[1:] or run.rows
    return [float(r[high]) / float(r[mean]) for r in timed if r.get(high) is not None and r.get(mean)]


MEASURES: tuple[Measure, ...] = (
    Measure("step", lambda run: run.per_step(STEP_S.at("max")), format_ms),
    Measure("slowest ÷ mean", _ratio_per_step, lambda r: f"{r:.2f}"),
)


def band(values: list[float]) -> Band | None:
    """The median and 10th–90th percentile of ``values``; ``None`` when there are none."""
    if not values:
        return None
    return Band(statistics.median(values), percentile(values, 0.1), percentile(values, 0.9))


def _chains(bands: list[tuple[Run, Band]]) -> list[list[tuple[Run, Band]]]:
    """Runs whose bands overlap, chained: sorted by the band's low end, a run joins the chain
    while its low end is at most the highest high end so far."""
    chains: list[list[tuple[Run, Band]]] = []
    reach = float("-inf")
    for item in sorted(bands, key=lambda pair: (pair[1].low, pair[1].high)):
        if chains and item[1].low <= reach:
            chains[-1].append(item)
            reach = max(reach, item[1].high)
        else:
            chains.append([item])
            reach = item[1].high
    return [chain for chain in chains if len(chain) > 1]


def noise_notes(runs: list[Run]) -> list[str]:
    """One line per set of runs at one world size whose timing bands overlap (see the module)."""
    lines = []
    for measure in MEASURES:
        for world in sorted({run.world_size for run in runs}):
            bands = [(run, b) for run in runs if run.world_size == world and (b := band(measure.values(run)))]
            for chain in _chains(bands):
                shown = "; ".join(
                    f"{run.label}: {measure.text(b.median)} (p10–p90 {measure.text(b.low)}–{measure.text(b.high)})"
                    for run, b in sorted(chain, key=lambda pair: pair[1].median)
                )
                lines.append(
                    f"{measure.column} at W={world} is within noise for {len(chain)} runs, whose step-to-step "
                    f"ranges overlap: {shown}. Their order here is not a result; more steps or a quieter "
                    "machine separate them."
                )
    return lines
