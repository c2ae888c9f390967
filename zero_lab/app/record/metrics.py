"""Per-step measurements of every rank, gathered with one small collective.

Each rank measures a fixed vector (:class:`RankStep`, the catalogue's per-rank metrics and its
loss); one ``all_gather`` of that float64 vector per step brings every rank's values everywhere,
and :func:`step_record` turns them into the catalogue's keys (:mod:`zero_lab.app.record.catalogue`:
``<key>/rank{r}``, ``/max``, ``/mean``; samples/s as the global batch over the slowest rank's step)::

    gather = MetricsGather(device)
    per_rank = gather(RankStep(loss=..., step_s=..., ...))   # collective, every rank
    record = step_record(step, per_rank, imbalance=1.0)
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from typing import Any

import torch

from zero_lab.app.record.catalogue import (
    EXCHANGE_EXPOSED_S,
    EXCHANGE_INTER_GROUP_BYTES,
    EXCHANGE_INTER_NODE_BYTES,
    EXCHANGE_S,
    EXCHANGE_SENT_BYTES,
    GRAD_BYTES,
    GRAD_NORM,
    GRAD_REDUCE_BYTES,
    GRAD_REDUCE_EXPOSED_S,
    GRAD_REDUCE_INTER_GROUP_BYTES,
    GRAD_REDUCE_INTER_NODE_BYTES,
    GRAD_REDUCE_S,
    IMBALANCE,
    LOSS,
    OPTIM_STEP_S,
    PER_RANK,
    SAMPLES_PER_S,
    Metric,
)
from zero_lab.comm import INTER_GROUP, INTER_NODE, INTRA_GROUP, INTRA_NODE, Communicator
from zero_lab.engine import engine_of
from zero_lab.optimizer import ZeroRedundancyOptimizer

__all__ = [
    "FIELDS",
    "LocalStepClock",
    "MetricsGather",
    "RankStep",
    "local_step_summary",
    "peak_memory_bytes",
    "phase_summary",
    "step_record",
]


@dataclass
class RankStep:
    """What one rank measured in one step (the catalogue's meanings; ``stop_signal``: a SIGTERM/SIGINT
    this rank received, :mod:`zero_lab.runtime.signals`, travelling with the metrics; 0 = none)."""

    loss: float
    step_s: float
    exchange_s: float = 0.0
    exchange_exposed_s: float = 0.0
    exchange_bytes: float = 0.0
    exchange_calls: float = 0.0
    optim_state_bytes: float = 0.0
    master_weight_bytes: float = 0.0
    tensor_bytes: float = 0.0
    peak_bytes: float = 0.0
    samples: float = 0.0
    grad_norm: float = 0.0
    optim_step_s: float = 0.0
    stop_signal: float = 0.0
    grad_reduce_bytes: float = 0.0
    exchange_sent_bytes: float = 0.0
    grad_reduce_s: float = 0.0
    grad_reduce_exposed_s: float = 0.0
    grad_bytes: float = 0.0
    grad_reduce_inter_group_bytes: float = 0.0
    grad_reduce_inter_node_bytes: float = 0.0
    exchange_inter_group_bytes: float = 0.0
    exchange_inter_node_bytes: float = 0.0


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RankStep))


class LocalStepClock:
    """Running seconds of an optimizer's *local* step: ZeRO's own counter
    (``local_step_seconds``: its shards' step, in ``step()`` or the overlap hooks, without
    the exchange), the engine's for an optimizer it re-pointed (its step on the owned ranges,
    without the reductions its pre-hook finishes or the all-gathers its post-hook issues), or,
    for a plain optimizer, step pre/post hooks around its ``step()``.

        clock = LocalStepClock(optimizer); before = clock.seconds(); optimizer.step()
        local = clock.seconds() - before
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self._total = 0.0
        self._started = 0.0
        self._counter: Any = optimizer if isinstance(optimizer, ZeroRedundancyOptimizer) else engine_of(optimizer)
        if self._counter is None:  # hooks of its own (registered after an engine's, they would span its gathers)
            optimizer.register_step_pre_hook(self._start)
            optimizer.register_step_post_hook(self._stop)

    def _start(self, *_: Any) -> None:
        self._started = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self._total += time.perf_counter() - self._started

    def seconds(self) -> float:
        return self._counter.local_step_seconds if self._counter is not None else self._total


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA peak allocated on a GPU device, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


class MetricsGather:
    """All-gathers one :class:`RankStep` per rank (one float64 collective of W x len(FIELDS))."""

    def __init__(self, device: torch.device):
        self.comm = Communicator()
        self.device = device
        self.world_size = self.comm.world_size
        self._out = torch.zeros(self.world_size * len(FIELDS), dtype=torch.float64, device=device)

    def sync(self) -> None:
        """Line the ranks up (one tiny all-reduce) so the first timed step starts together."""
        self.comm.all_reduce(torch.zeros(1, device=self.device), op="sync")

    def __call__(self, mine: RankStep) -> list[RankStep]:
        local = torch.tensor(astuple(mine), dtype=torch.float64, device=self.device)
        self.comm.all_gather_into(self._out, local, op="metrics")
        rows = self._out.view(self.world_size, len(FIELDS)).cpu().tolist()
        return [RankStep(*row) for row in rows]


def step_record(step: int, per_rank: list[RankStep], imbalance: float = 1.0, grad_norm: bool = False) -> dict[str, Any]:
    """The catalogue's keys of one step (see the module docstring); ``grad_norm``: the loop clips,
    so the gradient norm is recorded (rank 0's; every rank has the same)."""
    losses = [r.loss for r in per_rank]
    record: dict[str, Any] = {"step": step, LOSS.key: sum(losses) / len(losses)}
    record.update({LOSS.at(f"rank{r}"): loss for r, loss in enumerate(losses)})
    for metric in PER_RANK:
        values = [getattr(r, metric.name) for r in per_rank]
        record.update({metric.at(f"rank{r}"): value for r, value in enumerate(values)})
        record.update({metric.at("max"): max(values), metric.at("mean"): sum(values) / len(values)})
    slowest = max(r.step_s for r in per_rank)
    record[SAMPLES_PER_S.key] = sum(r.samples for r in per_rank) / slowest if slowest > 0 else 0.0
    record[IMBALANCE.key] = imbalance
    if grad_norm:
        record[GRAD_NORM.key] = per_rank[0].grad_norm
    return record


def _medians(records: list[dict[str, Any]], key: Callable[[str], str], world_size: int) -> list[float]:
    """Each rank's median over ``records`` of the per-rank metric whose keys ``key`` makes."""
    return [statistics.median(r[key(f"rank{k}")] for r in records) for k in range(world_size)]


def local_step_summary(records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """summary.json's local-step figures over ``records`` (the timed steps): each rank's median
    local optimizer step (a list by rank) and the median over steps of the slowest rank's ÷ the
    mean (``optim_step_max_over_mean``: 1.0 when the partition's cost is even)."""
    if not records:
        return {OPTIM_STEP_S.name: None, "optim_step_max_over_mean": None}
    high, mean = OPTIM_STEP_S.at("max"), OPTIM_STEP_S.at("mean")
    ratios = [r[high] / r[mean] for r in records if r[mean] > 0]
    return {
        OPTIM_STEP_S.name: _medians(records, OPTIM_STEP_S.at, world_size),
        "optim_step_max_over_mean": statistics.median(ratios) if ratios else None,
    }


#: Each phase's bytes sent, and of them what crossed shard groups and what crossed nodes.
_LINKED = {
    "grad_reduce": (GRAD_REDUCE_BYTES, GRAD_REDUCE_INTER_GROUP_BYTES, GRAD_REDUCE_INTER_NODE_BYTES),
    "param_exchange": (EXCHANGE_SENT_BYTES, EXCHANGE_INTER_GROUP_BYTES, EXCHANGE_INTER_NODE_BYTES),
}


def _per_link(records: list[dict[str, Any]], world_size: int, phase: str) -> dict[str, list[float]]:
    """One phase's bytes sent per rank (medians) by link class (:data:`zero_lab.comm.LINK_CLASSES`): what
    crossed shard groups and nodes, and the rest (inside a group, a node)."""
    total, inter_group, inter_node = (_medians(records, m.at, world_size) for m in _LINKED[phase])
    return {
        INTRA_GROUP: [t - i for t, i in zip(total, inter_group)],
        INTER_GROUP: inter_group,
        INTRA_NODE: [t - i for t, i in zip(total, inter_node)],
        INTER_NODE: inter_node,
    }


def phase_summary(training: Any, records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """summary.json's figures by phase over ``records`` (the timed steps): ``bytes_per_step``
    (each rank's median bytes sent, ``grad_reduce`` only with ``grad_reduce=`` or the engine), ``phase_time_s``
    (the slowest rank's medians), the gradient bytes (the last step's, per rank), the reducer's report."""
    if not records:
        return {}
    reducer, of_exchange = training.grad_reducer, training.strategy.of_exchange

    def slowest(metric: Metric) -> float | None:
        return statistics.median(r[metric.at("max")] for r in records)

    def reduced(value: Any) -> Any:  # a grad_reduce= hook's or the engine's reduction
        return value if training.grad_stats is not None else None

    return {
        "grad_reduce": reducer.report() if reducer is not None else None,
        "release_grads": bool(reducer is not None and reducer.release_grads),
        GRAD_BYTES.name: [records[-1][GRAD_BYTES.at(f"rank{k}")] for k in range(world_size)],
        "bytes_per_step": {
            "grad_reduce": reduced(_medians(records, GRAD_REDUCE_BYTES.at, world_size)),
            "param_exchange": of_exchange(_medians(records, EXCHANGE_SENT_BYTES.at, world_size)),
        },
        "bytes_per_link": {
            "grad_reduce": reduced(_per_link(records, world_size, "grad_reduce")),
            "param_exchange": of_exchange(_per_link(records, world_size, "param_exchange")),
        },
        "phase_time_s": {
            "grad_reduce": reduced(slowest(GRAD_REDUCE_S)),
            "grad_reduce_exposed": reduced(slowest(GRAD_REDUCE_EXPOSED_S)),
            "param_exchange": of_exchange(slowest(EXCHANGE_S)),
            "param_exchange_exposed": of_exchange(slowest(EXCHANGE_EXPOSED_S)),
        },
    }
