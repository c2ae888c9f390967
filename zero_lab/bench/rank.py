"""What every rank of a benchmark world runs: the memory phase, the timing rounds, the transport check.

1. **Memory phase** — strategies one at a time: reset the peak-RSS mark, build the
   strategy, run ``memory_steps`` iterations, read the peak; then the optimizer-state
   and tensor bytes, the partition imbalance, and one more iteration under the
   :class:`~zero_lab.bench.meter.CollectiveMeter` (calls and bytes of every collective,
   for strategies that do not meter their own; zero_lab's own meter of the same
   iteration beside it).
2. **Timing phase** — the strategies of a round are built side by side and stepped
   round-robin, one iteration each per step, the order rotated every step, a barrier
   before each iteration, so machine noise hits all alike. After the steps (and a
   prefetch strategy's last, deferred step), every strategy's parameters are compared
   with ``ddp``'s.

Both are collective: every rank runs the same strategies in the same order.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zero_lab.bench import host
from zero_lab.bench.meter import CollectiveMeter
from zero_lab.bench.stepper import Runner, max_abs_diff
from zero_lab.bench.strategies import STRATEGIES
from zero_lab.bench.workloads import MODELS, ModelPreset
from zero_lab.comm import Communicator
from zero_lab.partition import SortedGreedy

__all__ = ["RankJob", "bench_rank", "collectives_rank"]


@dataclass(frozen=True)
class RankJob:
    """What one world runs: per model, the strategies (memory) or the rounds (timing).

    ``need`` holds, per model and strategy, the bytes a rank must have free before
    building it (the guard against pushing the machine out of memory).
    """

    phase: str  # "memory" or "timing"
    models: tuple[str, ...]
    strategies: tuple[str, ...]
    warmup: int
    steps: int
    rounds: dict[str, list[list[str]]] = field(default_factory=dict)
    need: dict[str, dict[str, int]] = field(default_factory=dict)
    memory_steps: int = 2


def _run(runner: Runner, preset: ModelPreset, steps: int, first: int = 0) -> None:
    for step in range(first, first + steps):
        x, y = preset.batch(step, dist.get_rank())
        runner.iteration(x, y, preset.loss)


def _metered_iteration(runner: Runner, preset: ModelPreset, step: int, element_size: int) -> dict[str, Any]:
    """Collectives of one iteration by kind, from the profiler; ``own``: zero_lab's meter of the same iteration;
    ``grad_reduce_own``: zero_lab's meter of its gradient reduction where the profiler misses part of
    it (:attr:`Runner.grad_stats`), else ``None``."""
    x, y = preset.batch(step, dist.get_rank())
    before = runner.grad_stats().snapshot() if runner.grad_stats else None
    with CollectiveMeter(element_size, dist.get_world_size()) as meter:
        record = runner.iteration(x, y, preset.loss)
    out = {kind: {"calls": stats.calls, "bytes": stats.bytes} for kind, stats in meter.totals().items()}
    own = {"calls": record.exchange_calls, "bytes": record.exchange_bytes} if runner.comm_stats else None
    grads = runner.grad_stats().since(before) if runner.grad_stats and before is not None else None
    return out | {
        "own": own,
        "grad_reduce_own": None if grads is None else {"calls": grads.calls, "bytes": grads.bytes},
    }


def memory_phase(
    preset: ModelPreset, template: nn.Module, names: Sequence[str], steps: int, need: dict[str, int]
) -> dict[str, Any]:
    """Build each strategy alone; its peak RSS over the baseline, state, tensor and collective bytes.

    A throwaway DDP run first pays the one-time costs (lazy imports, thread pools,
    Gloo buffers) so they are not charged to the first strategy measured.
    """
    out: dict[str, Any] = {}
    _run(STRATEGIES["ddp"].build(template), preset, steps)
    element_size = next(template.parameters()).element_size()
    for name in names:
        gc.collect()
        if not host.memory_allows(need[name]):
            out[name] = None
            continue
        base = host.rss_bytes()
        can_reset = host.reset_peak_rss()
        runner = STRATEGIES[name].build(template)
        _run(runner, preset, steps)
        out[name] = {
            "rss_base_bytes": base,
            "peak_rss_delta_bytes": host.peak_rss_bytes() - base if can_reset else None,
            "state_bytes": runner.state_bytes(),
            "tensor_bytes": runner.tensor_bytes(),
            "imbalance": runner.imbalance,
            "report": runner.report() if runner.report else None,
            "collectives": _metered_iteration(runner, preset, steps, element_size),
        }
        runner.close()
        del runner
        host.release_memory()
    return out


def timing_round(preset: ModelPreset, template: nn.Module, names: Sequence[str], job: RankJob) -> dict[str, Any]:
    """Step the strategies of one round side by side, round-robin; per-step records.

    Strategies are built in order while :func:`~zero_lab.bench.host.memory_allows`
    them; the rest of the round is left out (listed under ``skipped``).
    """
    runners: dict[str, Runner] = {}
    for name in names:
        if not host.memory_allows(job.need[preset.name][name]):
            break
        runners[name] = STRATEGIES[name].build(template)
    skipped = [n for n in names if n not in runners]
    names = list(runners)
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    if not names:
        return {"strategies": [], "skipped": skipped, "records": {}, "max_abs_diff_vs_ddp": {}, "reports": {}}
    rank = dist.get_rank()
    for step in range(job.warmup + job.steps):
        x, y = preset.batch(step, rank)
        shift = step % len(names)
        for name in [*names[shift:], *names[:shift]]:
            record = runners[name].iteration(x, y, preset.loss)
            if step >= job.warmup:
                records[name].append(asdict(record))
    for runner in runners.values():  # a deferred (prefetch) step still pending: same number of updates as ddp
        runner.finish()
    reference = runners.get("ddp")
    diffs = {name: max_abs_diff(r.model, reference.model) if reference else None for name, r in runners.items()}
    reports = {name: r.report() for name, r in runners.items() if r.report}  # exchange=auto decides per world
    for runner in runners.values():
        runner.close()
    del runners, reference
    host.release_memory()
    return {
        "strategies": names,
        "skipped": skipped,
        "records": records,
        "max_abs_diff_vs_ddp": diffs,
        "reports": reports,
    }


def bench_rank(job: RankJob) -> dict[str, Any]:
    """What one rank measures, per model: the memory phase or the timing rounds."""
    torch.set_num_threads(1)
    if job.phase == "memory":
        host.return_freed_memory_to_os()
    else:
        host.keep_freed_memory()
    out: dict[str, Any] = {}
    for model_name in job.models:
        preset = MODELS[model_name]
        torch.manual_seed(0)
        template = preset.build()
        started = time.perf_counter()
        if job.phase == "memory":
            out[model_name] = memory_phase(preset, template, job.strategies, job.memory_steps, job.need[model_name])
        else:
            out[model_name] = [timing_round(preset, template, names, job) for names in job.rounds[model_name]]
        if dist.get_rank() == 0:
            elapsed = time.perf_counter() - started
            print(f"  [W={dist.get_world_size()}] {model_name}: {job.phase} phase {elapsed:.1f} s", flush=True)
        del template
        gc.collect()
    return out


def collectives_rank(sizes: list[int], repeats: int) -> dict[str, float]:
    """Median ms to bring every rank's part of a model-sized fp32 buffer to all ranks, 3 ways.

    The same bytes each time, through zero_lab's :class:`~zero_lab.comm.Communicator`:
    one all-gather into the buffer (flat's ``all_gather`` exchange); one broadcast per
    rank of its contiguous segment (bucket-view broadcast); one broadcast per parameter
    from its sorted-greedy owner (per tensor).
    """
    torch.set_num_threads(1)
    comm = Communicator()
    world, rank = comm.world_size, comm.rank
    buffer = torch.randn(sum(sizes))
    chunk = buffer.numel() // world
    buffer = buffer[: chunk * world]
    tensors = list(torch.randn(sum(sizes)).split(sizes))
    owners = SortedGreedy.assign(sizes, [0] * len(sizes), world)
    ways = {
        "all_gather_into_tensor": lambda: comm.all_gather_into(buffer, buffer[rank * chunk : (rank + 1) * chunk]),
        "one broadcast per rank": lambda: comm.broadcast_many(
            [(buffer[r * chunk : (r + 1) * chunk], r) for r in range(world)]
        ),
        "one broadcast per tensor": lambda: comm.broadcast_many(list(zip(tensors, owners))),
    }
    out = {}
    for name, fn in ways.items():
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name] = 1e3 * statistics.median(times)
    return out
