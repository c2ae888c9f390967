"""Per-step measurements of every rank, gathered to rank 0 with one small collective.

Each rank measures a fixed vector (:data:`FIELDS`): its loss, step time, time and bytes
of the optimizer's parameter exchange (``opt.comm_stats.since(...)``), optimizer-state
bytes (summed over the real state tensors), the bytes of every tensor it trains with
(parameters, gradients, buffers, optimizer state, master weights — what ZeRO shrinks,
without the interpreter's and torch's own memory), peak memory (CUDA peak allocated on
GPU, peak RSS on CPU) and samples. One ``all_gather`` of that float64 vector per step brings
every rank's values everywhere; :func:`step_record` turns them into namespaced keys
(the per-rank ones named by :data:`zero_lab.app.record.summary.STEP_KEYS`)::

    train/loss                      mean over ranks = the global-batch loss
    train/loss/rank{r}
    time/step_s/{rank{r},max,mean}  and time/exchange_s/..., comm/exchange_exposed_s/...,
    time/optim_step_s/...           the local optimizer step alone (ZeRO: this rank's shards, no
                                    exchange; a closure's forward/backward included): its max
                                    against its mean is the cost imbalance of the partition
    comm/exchange_bytes/...,
    comm/grad_reduce_bytes/...,     bytes sent by phase (CommStats.sent_bytes): the gradient reduction
    comm/exchange_sent_bytes/...    (grad_reduce=) and the parameter exchange; memory/grad_bytes/...
    time/grad_reduce_s/...          the param.grad bytes held after backward (shard_grads=true: owned only);
    comm/grad_reduce_exposed_s/...  the reduction in flight, and what of it backward waited for at its end
    comm/exchange_calls/..., memory/optim_state_bytes/..., memory/master_weight_bytes/...,
    memory/tensor_bytes/..., memory/peak_bytes/...
    memory/imbalance                partition max / ideal (1.0 for plain optimizers)
    train/samples_per_s             global batch / slowest rank's step time
    train/grad_norm                 global gradient norm before clipping (optim.max_grad_norm set)

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

from zero_lab.app.record.summary import NAMESPACED, STEP_KEYS, step_key
from zero_lab.comm import INTER_GROUP, INTER_NODE, INTRA_GROUP, INTRA_NODE, Communicator
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
    """What one rank measured in one step."""

    loss: float
    step_s: float
    exchange_s: float = 0.0
    exchange_exposed_s: float = 0.0  # of exchange_s, the time the loop was blocked (prefetch/overlap hide the rest)
    exchange_bytes: float = 0.0
    exchange_calls: float = 0.0
    optim_state_bytes: float = 0.0
    master_weight_bytes: float = 0.0
    tensor_bytes: float = 0.0  # params + grads + buffers + optimizer state, summed over distinct storages
    peak_bytes: float = 0.0
    samples: float = 0.0
    grad_norm: float = 0.0  # the global pre-clip norm (equal on every rank); 0 when not clipping
    optim_step_s: float = 0.0  # this rank's local optimizer step (LocalStepClock)
    stop_signal: float = 0.0  # a SIGTERM/SIGINT this rank received (zero_lab.runtime.signals); 0 = none
    # bytes this rank sent (CommStats.sent_bytes) by phase: the gradient reduction (grad_reduce=; 0 without it:
    # DDP's own all-reduce is not metered) and the parameter exchange
    grad_reduce_bytes: float = 0.0
    exchange_sent_bytes: float = 0.0
    grad_reduce_s: float = 0.0  # the gradient reduction's collectives in flight (issue to last wait), in backward
    grad_reduce_exposed_s: float = 0.0  # of it, what backward waited for after its own work was done
    grad_bytes: float = 0.0  # gradient storage held after backward: param.grad (+ DDP's buckets, with grad_reduce=)
    # of the bytes sent by phase, those that crossed shard groups (dist.shard_size) and nodes (CommStats.sent_by_link)
    grad_reduce_inter_group_bytes: float = 0.0
    grad_reduce_inter_node_bytes: float = 0.0
    exchange_inter_group_bytes: float = 0.0
    exchange_inter_node_bytes: float = 0.0


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RankStep))


class LocalStepClock:
    """Running seconds of an optimizer's *local* step: ZeRO's own counter
    (``local_step_seconds``: its shards' step, in ``step()`` or the overlap hooks, without
    the exchange), or, for a plain optimizer, step pre/post hooks around its ``step()``.

        clock = LocalStepClock(optimizer); before = clock.seconds(); optimizer.step()
        local = clock.seconds() - before
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self._total = 0.0
        self._started = 0.0
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            optimizer.register_step_pre_hook(self._start)
            optimizer.register_step_post_hook(self._stop)

    def _start(self, *_: Any) -> None:
        self._started = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self._total += time.perf_counter() - self._started

    def seconds(self) -> float:
        if isinstance(self.optimizer, ZeroRedundancyOptimizer):
            return self.optimizer.local_step_seconds
        return self._total


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


def _per_rank(prefix: str, values: list[float]) -> dict[str, float]:
    out = {f"{prefix}/rank{r}": v for r, v in enumerate(values)}
    out[f"{prefix}/max"] = max(values)
    out[f"{prefix}/mean"] = sum(values) / len(values)
    return out


def step_record(step: int, per_rank: list[RankStep], imbalance: float = 1.0, grad_norm: bool = False) -> dict[str, Any]:
    """The namespaced metrics of one step (see the module docstring); ``grad_norm``: the
    loop clips, so ``train/grad_norm`` is recorded (rank 0's; every rank has the same)."""
    losses = [r.loss for r in per_rank]
    record: dict[str, Any] = {"step": step, "train/loss": sum(losses) / len(losses)}
    record.update({f"train/loss/rank{r}": loss for r, loss in enumerate(losses)})
    for field, prefix in STEP_KEYS.items():
        record.update(_per_rank(prefix, [getattr(r, field) for r in per_rank]))
    slowest = max(r.step_s for r in per_rank)
    record[NAMESPACED["samples_per_s"]] = sum(r.samples for r in per_rank) / slowest if slowest > 0 else 0.0
    record[NAMESPACED["imbalance"]] = imbalance
    if grad_norm:
        record["train/grad_norm"] = per_rank[0].grad_norm
    return record


def local_step_summary(records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """summary.json's local-step figures over ``records`` (the timed steps): each rank's median
    ``time/optim_step_s`` (``optim_step_s``, a list by rank) and the median over steps of the
    slowest rank's ÷ the mean (``optim_step_max_over_mean``: 1.0 when the partition's cost is even)."""
    if not records:
        return {"optim_step_s": None, "optim_step_max_over_mean": None}
    per_rank = [statistics.median(r[step_key("optim_step_s", f"rank{k}")] for r in records) for k in range(world_size)]
    high, mean = step_key("optim_step_s", "max"), step_key("optim_step_s", "mean")
    ratios = [r[high] / r[mean] for r in records if r[mean] > 0]
    return {"optim_step_s": per_rank, "optim_step_max_over_mean": statistics.median(ratios) if ratios else None}


def _per_link(per_rank: Callable[[str], list[float]], sent: str, phase: str) -> dict[str, list[float]]:
    """One phase's bytes sent per rank by link class (:data:`zero_lab.comm.LINK_CLASSES`): what
    crossed shard groups and nodes, and the rest of what was sent (inside a group, inside a node)."""
    total = per_rank(sent)
    inter_group, inter_node = per_rank(f"{phase}_inter_group_bytes"), per_rank(f"{phase}_inter_node_bytes")
    return {
        INTRA_GROUP: [t - i for t, i in zip(total, inter_group)],
        INTER_GROUP: inter_group,
        INTRA_NODE: [t - i for t, i in zip(total, inter_node)],
        INTER_NODE: inter_node,
    }


def phase_summary(training: Any, records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """summary.json's figures by phase over ``records`` (the timed steps): ``bytes_per_step``
    (each rank's median bytes sent, ``grad_reduce`` only with ``grad_reduce=``), ``phase_time_s``
    (the slowest rank's medians), ``grad_bytes`` (the last step's, per rank), the reducer's report."""
    if not records:
        return {}
    reducer = training.grad_reducer

    def per_rank(measurement: str) -> list[float]:
        return [statistics.median(r[step_key(measurement, f"rank{k}")] for r in records) for k in range(world_size)]

    def slowest(measurement: str) -> float:
        return statistics.median(r[step_key(measurement, "max")] for r in records)

    last = records[-1]
    return {
        "grad_reduce": reducer.report() if reducer is not None else None,
        "shard_grads": bool(reducer is not None and reducer.shard_grads),
        "grad_bytes": [last[step_key("grad_bytes", f"rank{k}")] for k in range(world_size)],
        "bytes_per_step": {
            "grad_reduce": per_rank("grad_reduce_bytes") if reducer is not None else None,
            "param_exchange": training.strategy.of_exchange(per_rank("exchange_sent_bytes")),
        },
        "bytes_per_link": {
            "grad_reduce": _per_link(per_rank, "grad_reduce_bytes", "grad_reduce") if reducer is not None else None,
            "param_exchange": training.strategy.of_exchange(_per_link(per_rank, "exchange_sent_bytes", "exchange")),
        },
        "phase_time_s": {
            "grad_reduce": slowest("grad_reduce_s") if reducer is not None else None,
            "grad_reduce_exposed": slowest("grad_reduce_exposed_s") if reducer is not None else None,
            "param_exchange": training.strategy.of_exchange(slowest("exchange_s")),
            "param_exchange_exposed": training.strategy.of_exchange(slowest("exchange_exposed_s")),
        },
    }
