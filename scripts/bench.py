"""Benchmark zero_lab against torch's ZeroRedundancyOptimizer, FairScale OSS and DDP + Adam.

One invocation runs every strategy on the same model, the same initial weights and the
same data, for each world size, and prints ratios::

    python scripts/bench.py --quick      # ≈ 3 min on 2 CPU cores: 4 of the 20 layers, 8 timed steps
    python scripts/bench.py              # full: 20×Linear(2000,2000) and the LM, W = 1, 2, 4

Every strategy is DDP (Gloo, default buckets) + Adam, differing only in the optimizer:
``ddp`` (plain Adam), ``torch`` / ``torch_bv`` (torch's ZeroRedundancyOptimizer,
``parameters_as_bucket_view`` off / on), ``fairscale_oss`` (FairScale's OSS, if
importable), and zero_lab ``zl_sg`` / ``zl_flat`` (SortedGreedy / Flat, ``_bv`` = bucket
view on) and ``zl_overlap`` / ``zl_overlap_il`` (``hook_with_zero_step`` /
``hook_with_zero_step_interleaved``, DdpBucket partition).

How each number is measured, per world (one process per rank, one thread each):

1. **Memory phase** — strategies one at a time: reset the kernel's peak-RSS mark
   (``/proc/self/clear_refs``), build the strategy, run 2 iterations, read the peak
   (``VmHWM``). *Peak RSS Δ* = that peak − RSS before building, i.e. everything the
   strategy added (model copy, DDP buckets, gradients, state, transient buffers). Ranks
   set malloc's mmap threshold to 64 KiB (``mallopt``) so freed tensors go back to the
   OS and the next strategy starts from the same baseline (the timing world keeps
   malloc's defaults). *State bytes* sum the real tensors in
   the local optimizer's ``state``; the planner's prediction is checked against them.
2. **Timing phase** — the strategies of a *round* are built side by side in the same
   ranks and stepped round-robin, one iteration each per step, the order rotated every
   step, after a barrier, so machine noise hits all alike. An iteration is
   ``forward + backward + optimizer.step()``; per step the slowest rank's time counts.
   Ratios are **medians of per-step ratios** against the strategy in the same round.
   *Exchange time* = ``optimizer.step()`` − the local optimizer's own ``step()``
   (timed with step hooks); with overlap the exchange runs inside backward and is not
   separable. *Bytes/step* = parameter-exchange payload per rank: zero_lab's
   ``comm_stats``, and for torch/FairScale the tensors they pass to
   ``torch.distributed.broadcast`` during ``step()``; the minimum is every
   trainable element once (the model's bytes).

Rounds hold all strategies when their measured peaks (memory phase) fit in
``--memory-budget`` of the machine's available memory, else as many as fit, always with
``ddp`` and the torch strategy each zero_lab one is compared with. Before every build,
all ranks check (one all-reduce) that the machine still has room; what does not fit is
left out and said so. With more ranks than cores, timing runs only if one round holds
everything, and its times are oversubscribed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # zero_lab from this checkout, installed or not

from zero_lab import ZeroRedundancyOptimizer  # noqa: E402
from zero_lab.comm import CommStats  # noqa: E402
from zero_lab.partition import Flat, SortedGreedy  # noqa: E402
from zero_lab.planner import plan_memory, specs_from_module  # noqa: E402

LR = 1e-3
MIB = 2**20


# --------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelPreset:
    """A model and its synthetic data; ``batch(step, rank)`` is the same for every strategy."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _generator(step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 * step + rank)


def _mlp(depth: int) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(*[nn.Linear(2000, 2000) for _ in range(depth)])


def _mlp_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator(step, rank)
    return torch.randn(20, 2000, generator=g), torch.randn(20, 2000, generator=g)


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 40), nn.Tanh(), nn.Linear(40, 16))


def _tiny_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _generator(step, rank)
    return torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)


class TiedLM(nn.Module):
    """zero_lab's TinyLM with the LM head tied to the token embedding (as GPT-2 does)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_layer: int):
        super().__init__()
        from zero_lab.app.models import TinyLM

        self.lm = TinyLM(vocab, seq_len, d_model, n_layer, n_head=4)
        self.lm.head.weight = self.lm.tok_emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(tokens)


def _lm_batch(batch: int, seq_len: int) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    def make(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, 32_000, (batch, seq_len + 1), generator=_generator(step, rank))
        return tokens[:, :-1], tokens[:, 1:]

    return make


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


MODELS: dict[str, ModelPreset] = {
    "tutorial": ModelPreset(
        "tutorial", "20×Linear(2000,2000), batch 20, MSE (torch's ZeRO tutorial)", _mlp(20), _mlp_batch, F.mse_loss
    ),
    "tutorial-quick": ModelPreset(
        "tutorial-quick",
        "4×Linear(2000,2000) (the tutorial, 4 of its 20 layers), batch 20, MSE",
        _mlp(4),
        _mlp_batch,
        F.mse_loss,
    ),
    "lm": ModelPreset(
        "lm",
        "tied-embedding LM: vocab 32000 × d 256, 4 blocks, 2×64 tokens",
        lambda: TiedLM(32_000, 64, 256, 4),
        _lm_batch(2, 64),
        _lm_loss,
    ),
    "lm-quick": ModelPreset(
        "lm-quick",
        "tied-embedding LM: vocab 32000 × d 256, 2 blocks, 2×32 tokens",
        lambda: TiedLM(32_000, 32, 256, 2),
        _lm_batch(2, 32),
        _lm_loss,
    ),
    "tiny": ModelPreset("tiny", "3 small Linear layers (for tests)", _tiny, _tiny_batch, F.mse_loss),
}


# --------------------------------------------------------------------------- strategies
@dataclass(frozen=True)
class Strategy:
    """One optimizer setup; ``reference`` is the torch strategy at equal settings."""

    name: str
    label: str
    reference: str | None
    zero_lab: bool = False


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("ddp", "DDP + Adam", None),
        Strategy("ddp_aa", "DDP + Adam again: the A/A control (its ÷ DDP is the noise)", "ddp"),
        Strategy("torch", "torch ZeRO", None),
        Strategy("torch_bv", "torch ZeRO, bucket view", None),
        Strategy("fairscale_oss", "FairScale OSS", "torch_bv"),
        Strategy("zl_sg", "zero_lab sorted_greedy", "torch", True),
        Strategy("zl_sg_bv", "zero_lab sorted_greedy, bucket view", "torch_bv", True),
        Strategy("zl_flat", "zero_lab flat", "torch", True),
        Strategy("zl_flat_bv", "zero_lab flat, bucket view", "torch_bv", True),
        Strategy("zl_overlap", "zero_lab overlap (hook_with_zero_step)", "torch_bv", True),
        Strategy("zl_overlap_il", "zero_lab overlap (interleaved hook)", "torch_bv", True),
    )
}


def fairscale_status() -> tuple[bool, str]:
    """Whether FairScale's OSS imports with this torch, and its version or the error."""
    try:
        import fairscale
        from fairscale.optim import OSS  # noqa: F401
    except Exception as error:  # ImportError, or an incompatibility raised at import
        return False, f"not importable ({type(error).__name__}: {error}); `make bench-deps` installs it"
    return True, f"fairscale {fairscale.__version__}"


# --------------------------------------------------------------------------- collective metering
_active_meter: CommStats | None = None


def _metered(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a ``torch.distributed`` collective so its tensor payload counts on the active meter."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _active_meter is not None:
            tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
            if tensors:  # broadcast: the tensor; all_gather_into_tensor: the output first
                _active_meter.bytes += tensors[0].numel() * tensors[0].element_size()
                _active_meter.calls += 1
        return fn(*args, **kwargs)

    wrapper.bench_metered = True  # type: ignore[attr-defined]
    return wrapper


def install_meters() -> None:
    """Meter ``dist.broadcast`` / ``dist.all_gather_into_tensor`` (torch's and FairScale's exchange)."""
    for name in ("broadcast", "all_gather_into_tensor"):
        if not hasattr(getattr(dist, name), "bench_metered"):
            setattr(dist, name, _metered(getattr(dist, name)))


@contextlib.contextmanager
def metering(stats: CommStats | None) -> Iterator[None]:
    global _active_meter
    _active_meter = stats
    try:
        yield
    finally:
        _active_meter = None


# --------------------------------------------------------------------------- runners
@dataclass
class StepRecord:
    """One iteration of one strategy on this rank (seconds, bytes)."""

    iter_s: float
    step_s: float
    local_s: float
    exchange_bytes: int
    exchange_calls: int
    metered_s: float


class Runner:
    """A DDP model and its optimizer; :meth:`iteration` times one training step."""

    def __init__(self, name: str, model: nn.Module, ddp: DDP, optimizer: Any, local: torch.optim.Optimizer):
        self.name = name
        self.model = model
        self.ddp = ddp
        self.optimizer = optimizer
        self.local = local
        self.stats_fn: Callable[[], CommStats] = CommStats
        self.patched_stats: CommStats | None = None
        self.steps_in_backward = getattr(optimizer, "exchange_mode", "") == "overlap_per_bucket"
        self.on_close: list[Callable[[], None]] = []
        self._local_s = 0.0
        self._local_start = 0.0
        local.register_step_pre_hook(self._pre)
        local.register_step_post_hook(self._post)

    def _pre(self, *_: Any) -> None:
        self._local_start = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self._local_s += time.perf_counter() - self._local_start

    def iteration(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor]) -> StepRecord:
        self.optimizer.zero_grad(set_to_none=True)
        self._local_s = 0.0
        before = self.stats_fn().snapshot()
        dist.barrier()
        start = time.perf_counter()
        loss_fn(self.ddp(x), y).backward()
        middle = time.perf_counter()
        local_in_backward = self._local_s
        if not self.steps_in_backward:  # with overlap, step() is a no-op that warns
            with metering(self.patched_stats):
                self.optimizer.step()
        end = time.perf_counter()
        moved = self.stats_fn().since(before)
        return StepRecord(
            iter_s=end - start,
            step_s=end - middle,
            local_s=self._local_s - local_in_backward,
            exchange_bytes=moved.bytes,
            exchange_calls=moved.calls,
            metered_s=moved.seconds,
        )

    def close(self) -> None:
        """Break reference cycles that would keep this strategy's tensors alive after ``del``."""
        for action in self.on_close:
            action()
        self.on_close.clear()

    def state_bytes(self) -> int:
        """Bytes of every tensor in the local optimizer's state (this rank's shard for ZeRO)."""
        return sum(
            value.numel() * value.element_size()
            for state in self.local.state.values()
            for value in state.values()
            if torch.is_tensor(value)
        )

    def tensor_bytes(self) -> int:
        """Parameters + gradients + optimizer state, counted once per distinct storage."""
        storages: dict[int, int] = {}
        tensors = [p for p in self.model.parameters()] + [p.grad for p in self.model.parameters()]
        tensors += [v for s in self.local.state.values() for v in s.values() if torch.is_tensor(v)]
        for tensor in tensors:
            if tensor is not None:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def imbalance(self) -> float | None:
        """Max / ideal elements per rank of the partition (None: not sharded)."""
        if isinstance(self.optimizer, ZeroRedundancyOptimizer):
            return self.optimizer.partition.report().imbalance
        if self.name.startswith("torch"):
            return _imbalance(
                [sum(p.numel() for g in groups for p in g["params"]) for groups in _torch_partition(self)]
            )
        if self.name == "fairscale_oss":
            return _imbalance(
                [
                    sum(p.numel() for g in groups for p in g["params"])
                    for groups in self.optimizer.partition_parameters()
                ]
            )
        return None


def _torch_partition(runner: Runner) -> list[list[dict[str, Any]]]:
    return runner.optimizer._partition_parameters()


def _imbalance(per_rank: Sequence[int]) -> float:
    ideal = sum(per_rank) / len(per_rank)
    return max(per_rank) / ideal if ideal else 1.0


def build_runner(name: str, template: nn.Module) -> Runner:
    """A fresh copy of ``template`` in DDP with strategy ``name``'s optimizer."""
    model = copy.deepcopy(template)
    ddp = DDP(model)
    if name in ("ddp", "ddp_aa"):
        adam = torch.optim.Adam(ddp.parameters(), lr=LR)
        return Runner(name, model, ddp, adam, adam)
    if name in ("torch", "torch_bv"):
        from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

        zero = TorchZero(ddp.parameters(), torch.optim.Adam, parameters_as_bucket_view=name == "torch_bv", lr=LR)
        runner = Runner(name, model, ddp, zero, zero.optim)
        runner.patched_stats = CommStats()
        runner.stats_fn = lambda: runner.patched_stats
        return runner
    if name == "fairscale_oss":
        from fairscale.optim import OSS

        oss = OSS(ddp.parameters(), optim=torch.optim.Adam, lr=LR)
        runner = Runner(name, model, ddp, oss, oss.optim)
        runner.patched_stats = CommStats()
        runner.stats_fn = lambda: runner.patched_stats
        return runner
    return _zero_lab_runner(name, model, ddp)


def _zero_lab_runner(name: str, model: nn.Module, ddp: DDP) -> Runner:
    if name.startswith("zl_overlap"):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved

        zero = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=LR)
        make_hook = hook_with_zero_step_interleaved if name == "zl_overlap_il" else hook_with_zero_step
        hook = make_hook(allreduce_hook, ddp, zero)
        ddp.register_comm_hook(None, hook)
        runner = Runner(name, model, ddp, zero, zero.optim)  # after the hook: it rebuilds zero.optim
        runner.stats_fn = lambda: zero.comm_stats  # the hook meters its exchange there
        return runner
    partitioner = Flat() if name.startswith("zl_flat") else SortedGreedy()
    zero = ZeroRedundancyOptimizer(
        ddp.parameters(),
        torch.optim.Adam,
        parameters_as_bucket_view=name.endswith("_bv"),
        partitioner=partitioner,
        lr=LR,
    )
    runner = Runner(name, model, ddp, zero, zero.optim)
    runner.stats_fn = lambda: zero.comm_stats
    return runner


# --------------------------------------------------------------------------- memory probes
def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rss_bytes() -> int:
    return _proc_status_kib("VmRSS") * 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS; False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    return _proc_status_kib("VmHWM") * 1024


def release_memory() -> None:
    """Collect garbage and hand malloc's free heap back to the OS (glibc ``malloc_trim``)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def return_freed_memory_to_os(threshold: int = 64 * 1024) -> bool:
    """glibc: serve every allocation ≥ ``threshold`` by mmap, so ``free`` unmaps it at once.

    Without this, malloc's dynamic threshold keeps freed tensors of up to 32 MiB in its
    heap, and a strategy built after another one reuses them without raising RSS.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, threshold))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


# --------------------------------------------------------------------------- rank program
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


#: Memory every rank leaves free for the rest of the machine when deciding to build more.
FLOOR_BYTES = 2 * 2**30


def memory_allows(need_bytes: int) -> bool:
    """Collective: True on every rank iff every rank has ``need_bytes`` + a floor available.

    ``MemAvailable`` is machine-wide; all ranks of a world share it, so the need is
    multiplied by the world size. One all-reduce (MIN) keeps the decision identical on
    all ranks, so no rank builds a model (and its DDP collectives) the others skip.
    """
    world = dist.get_world_size()
    free = torch.tensor([available_bytes() - world * need_bytes - FLOOR_BYTES], dtype=torch.float64)
    dist.all_reduce(free, op=dist.ReduceOp.MIN)
    return free.item() >= 0


def memory_phase(
    preset: ModelPreset, template: nn.Module, names: Sequence[str], steps: int, need: dict[str, int]
) -> dict[str, Any]:
    """Build each strategy alone; its peak RSS over the baseline, state and tensor bytes.

    A throwaway DDP run first pays the one-time costs (lazy imports, thread pools,
    Gloo buffers) so they are not charged to the first strategy measured.
    """
    out: dict[str, Any] = {}
    _run(build_runner("ddp", template), preset, steps)
    for name in names:
        gc.collect()
        if not memory_allows(need[name]):
            out[name] = None
            continue
        base = rss_bytes()
        can_reset = reset_peak_rss()
        runner = build_runner(name, template)
        _run(runner, preset, steps)
        out[name] = {
            "rss_base_bytes": base,
            "peak_rss_delta_bytes": peak_rss_bytes() - base if can_reset else None,
            "state_bytes": runner.state_bytes(),
            "tensor_bytes": runner.tensor_bytes(),
            "imbalance": runner.imbalance(),
            "exchange_mode": getattr(runner.optimizer, "exchange_mode", None),
        }
        runner.close()
        del runner
        release_memory()
    return out


def _run(runner: Runner, preset: ModelPreset, steps: int) -> Runner:
    for step in range(steps):
        x, y = preset.batch(step, dist.get_rank())
        runner.iteration(x, y, preset.loss)
    return runner


def timing_round(preset: ModelPreset, template: nn.Module, names: Sequence[str], job: RankJob) -> dict[str, Any]:
    """Step the strategies of one round side by side, round-robin; per-step records.

    Strategies are built in order while :func:`memory_allows` them; the rest of the
    round is left out (listed under ``skipped``).
    """
    runners: dict[str, Runner] = {}
    for name in names:
        if not memory_allows(job.need[preset.name][name]):
            break
        runners[name] = build_runner(name, template)
    skipped = [n for n in names if n not in runners]
    names = list(runners)
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    if not names:
        return {"strategies": [], "skipped": skipped, "records": {}, "max_abs_diff_vs_ddp": {}}
    rank = dist.get_rank()
    for step in range(job.warmup + job.steps):
        x, y = preset.batch(step, rank)
        shift = step % len(names)
        for name in [*names[shift:], *names[:shift]]:
            record = runners[name].iteration(x, y, preset.loss)
            if step >= job.warmup:
                records[name].append(asdict(record))
    reference = runners.get("ddp")
    diffs = {
        name: _max_abs_diff(runner.model, reference.model) if reference else None for name, runner in runners.items()
    }
    for runner in runners.values():
        runner.close()
    del runners, reference
    release_memory()
    return {"strategies": names, "skipped": skipped, "records": records, "max_abs_diff_vs_ddp": diffs}


@torch.no_grad()
def _max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def bench_rank(job: RankJob) -> dict[str, Any]:
    """What one rank measures, per model: the memory phase or the timing rounds."""
    torch.set_num_threads(1)
    install_meters()
    if job.phase == "memory":
        return_freed_memory_to_os()
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


# --------------------------------------------------------------------------- planning rounds
def strategy_cost_bytes(model_name: str, name: str, world_size: int) -> int:
    """Planner estimate of one strategy's bytes on its worst rank.

    Model copy + gradients + DDP buckets + optimizer state, plus one model-sized
    transient for exchanges that stage through a fresh buffer (flat without bucket
    view, overlap).
    """
    with torch.device("meta"):
        model = MODELS[model_name].build()
    specs = specs_from_module(model)
    partitioner = None if name.startswith("ddp") else Flat() if name.startswith("zl_flat") else SortedGreedy()
    plan = plan_memory(specs, world_size, partitioner, torch.optim.Adam, lr=LR)
    worst = max(plan.ranks, key=lambda r: r.total_bytes)
    transient = worst.param_bytes if name in ("zl_flat", "zl_overlap", "zl_overlap_il") else 0
    return worst.total_bytes + transient


def available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 2**30


def _family(name: str) -> str:
    """Strategies compared with each other: ``zl_sg`` / ``zl_sg_bv``, ``zl_overlap`` / ``zl_overlap_il``."""
    return name.removesuffix("_bv").removesuffix("_il")


def _packing_units(names: Sequence[str]) -> list[list[str]]:
    """Families of the strategies to compare, zero_lab's first; references come with them."""
    referenced = {STRATEGIES[n].reference for n in names}
    compared = [n for n in names if n != "ddp" and n not in referenced]
    units: dict[str, list[str]] = {}
    for name in sorted(compared, key=lambda n: not STRATEGIES[n].zero_lab):
        units.setdefault(_family(name), []).append(name)
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
    several rounds), so every zero_lab ÷ torch ratio is paired within a round. In order
    of preference a round also holds ``ddp``, and a whole family (``zl_sg`` with
    ``zl_sg_bv``); when a family fits only without ``ddp`` it runs without it, and when
    it does not fit at all its members run one by one. Returns the rounds and the
    strategies that do not fit even alone with their reference.
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


# --------------------------------------------------------------------------- summarising
def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def merge_ranks(memory_ranks: list[dict[str, Any]], timing_ranks: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """Per strategy: per-rank memory figures, and per step the slowest rank's record."""
    out: dict[str, Any] = {}
    memory = [r[model] for r in memory_ranks]
    for name in (n for n in memory[0] if memory[0][n] is not None):
        entry = {key: [m[name][key] for m in memory] for key in memory[0][name]}
        entry["imbalance"] = memory[0][name]["imbalance"]
        entry["exchange_mode"] = memory[0][name]["exchange_mode"]
        out[name] = entry
    for index, round_ in enumerate(timing_ranks[0][model] if timing_ranks else []):
        for name in round_["strategies"]:
            steps = [_slowest(step) for step in zip(*(r[model][index]["records"][name] for r in timing_ranks))]
            entry = out.setdefault(name, {})
            entry.setdefault("steps_by_round", {})[str(index)] = steps
            entry["steps"] = entry.get("steps", []) + steps
            entry["max_abs_diff_vs_ddp"] = round_["max_abs_diff_vs_ddp"][name]
    return out


def _slowest(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One step across ranks: the slowest rank's times; bytes and calls of rank 0 (equal on all)."""
    return {
        "iter_s": max(r["iter_s"] for r in records),
        "step_s": max(r["step_s"] for r in records),
        "exchange_s": max(r["step_s"] - r["local_s"] for r in records),
        "metered_s": max(r["metered_s"] for r in records),
        "exchange_bytes": records[0]["exchange_bytes"],
        "exchange_calls": records[0]["exchange_calls"],
    }


def paired_ratio(results: dict[str, Any], name: str, ref: str | None, key: str) -> float | None:
    """Median over steps of ``name[key] / ref[key]`` in a round both ran in; else ratio of medians."""
    a, b = results.get(name, {}), results.get(ref or "", {})
    if "steps" not in a or "steps" not in b:
        return None
    common = sorted(set(a["steps_by_round"]) & set(b["steps_by_round"]))
    if common:
        pairs = zip(a["steps_by_round"][common[0]], b["steps_by_round"][common[0]])
        return _median([x[key] / y[key] for x, y in pairs if y[key] > 0])
    ma, mb = _median([s[key] for s in a["steps"]]), _median([s[key] for s in b["steps"]])
    return ma / mb if ma is not None and mb else None


def _ms(steps: list[dict[str, Any]], key: str) -> float | None:
    value = _median([s[key] for s in steps])
    return None if value is None else 1e3 * value


def summarize(results: dict[str, Any], model_bytes: int, planned: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    """The figures of the printed tables, per strategy (memory: the worst rank)."""
    table = {}

    def worst(name: str | None, key: str) -> int | None:
        values = [v for v in results.get(name or "", {}).get(key, []) if v is not None]
        return max(values) if values else None

    ddp_state = worst("ddp", "state_bytes")
    for name, r in results.items():
        ref = STRATEGIES[name].reference
        state, ref_state, peak = (
            worst(name, "state_bytes"),
            worst(ref, "state_bytes"),
            worst(name, "peak_rss_delta_bytes"),
        )
        steps = r.get("steps", [])
        sharded = bool(steps) and not name.startswith("ddp")
        separable = sharded and not name.startswith("zl_overlap")
        table[name] = {
            "state_mib": None if state is None else state / MIB,
            "state_vs_ddp": state / ddp_state if state is not None and ddp_state else None,
            "state_vs_torch": state / ref_state
            if state is not None and ref_state and ref.startswith("torch")
            else None,
            "planned_state_ok": planned[name] == r["state_bytes"] if name in planned and "state_bytes" in r else None,
            "tensor_mib": None if worst(name, "tensor_bytes") is None else worst(name, "tensor_bytes") / MIB,
            "peak_rss_delta_mib": None if peak is None else peak / MIB,
            "imbalance": r.get("imbalance"),
            "iter_ms": _ms(steps, "iter_s"),
            "iter_vs_torch": paired_ratio(results, name, ref, "iter_s") if ref and ref.startswith("torch") else None,
            "iter_vs_ddp": paired_ratio(results, name, "ddp", "iter_s") if name != "ddp" else None,
            "exchange_ms": _ms(steps, "exchange_s") if separable else None,
            "collective_ms": _ms(steps, "metered_s") if separable and STRATEGIES[name].zero_lab else None,
            "bytes_vs_min": _median([s["exchange_bytes"] for s in steps]) / model_bytes if sharded else None,
            "calls_per_step": _median([s["exchange_calls"] for s in steps]) if sharded else None,
            "max_abs_diff_vs_ddp": r.get("max_abs_diff_vs_ddp"),
        }
    return table


def planned_state(model_name: str, world_size: int, names: Sequence[str]) -> dict[str, list[int]]:
    """The planner's per-rank state bytes, for strategies whose partition it knows."""
    with torch.device("meta"):
        model = MODELS[model_name].build()
    specs = specs_from_module(model)
    greedy = ("torch", "torch_bv", "zl_sg", "zl_sg_bv")  # FairScale's OSS assigns in its own order
    partitioners = {"ddp": None, "ddp_aa": None} | {n: SortedGreedy() for n in greedy}
    partitioners |= {n: Flat() for n in ("zl_flat", "zl_flat_bv")}
    return {
        name: [r.state_bytes for r in plan_memory(specs, world_size, part, torch.optim.Adam, lr=LR).ranks]
        for name, part in partitioners.items()
        if name in names
    }


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, spec)


MEMORY_COLUMNS = (
    ("state_mib", "Adam state MiB", ".1f"),
    ("state_vs_ddp", "÷ DDP", ".3f"),
    ("state_vs_torch", "÷ torch", ".3f"),
    ("planned_state_ok", "planner exact", ""),
    ("tensor_mib", "tensors MiB", ".0f"),
    ("peak_rss_delta_mib", "peak RSS Δ MiB", ".0f"),
    ("imbalance", "imbalance", ".3f"),
)
SPEED_COLUMNS = (
    ("iter_ms", "iteration ms", ".1f"),
    ("iter_vs_torch", "÷ torch", ".3f"),
    ("iter_vs_ddp", "÷ DDP", ".3f"),
    ("exchange_ms", "exchange ms", ".1f"),
    ("collective_ms", "in collectives ms", ".1f"),
    ("bytes_vs_min", "bytes ÷ min", ".3f"),
    ("calls_per_step", "calls", ".0f"),
    ("max_abs_diff_vs_ddp", "max abs Δparam vs DDP", ".1e"),
)


def format_table(table: dict[str, dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table, one row per strategy."""
    head = "| strategy | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "|".join("---:" for _ in columns) + "|"
    rows = [
        f"| {name} | " + " | ".join(_fmt(row[key], spec) for key, _, spec in columns) + " |"
        for name, row in table.items()
        if any(row[key] is not None for key, _, _ in columns)
    ]
    return "\n".join([head, rule, *rows])


# --------------------------------------------------------------------------- targets
def evaluate_targets(runs: list[dict[str, Any]], bucket_model: str) -> list[dict[str, Any]]:
    """The issue's W=2 targets, each with the measured figure and met / missed."""
    targets = []
    for run in (r for r in runs if r["world_size"] == 2):
        table, results, model = run["table"], run["results"], run["model"]
        noise = table.get("ddp_aa", {}).get("iter_vs_ddp")
        if noise is not None:
            targets.append(
                {
                    "model": model,
                    "target": "A/A control ddp_aa ÷ ddp iteration (the noise)",
                    "measured": noise,
                    "met": None,
                }
            )
        if table.get("zl_flat", {}).get("state_vs_ddp") is not None:
            value = table["zl_flat"]["state_vs_ddp"]
            targets.append(_target(model, "zl_flat Adam state ≤ 0.51 × DDP's (worst rank)", value, value <= 0.51))
        for name in ("zl_sg", "zl_sg_bv"):
            ref = STRATEGIES[name].reference
            if name in results and ref in results:
                equal = results[name]["state_bytes"] == results[ref]["state_bytes"]
                targets.append(_target(model, f"{name} state bytes == {ref}'s on every rank", float(equal), equal))
        for name in ("zl_sg", "zl_sg_bv", "zl_flat", "zl_flat_bv"):
            value = table.get(name, {}).get("iter_vs_torch")
            if value is not None:
                ref = STRATEGIES[name].reference
                targets.append(_target(model, f"{name} iteration time ≤ {ref}'s (median ratio)", value, value <= 1.0))
        if model == bucket_model:
            torch_ratio = paired_ratio(results, "torch", "torch_bv", "exchange_s")
            if torch_ratio is not None:
                what = "torch's own exchange time, per tensor ÷ bucket view (for comparison)"
                targets.append({"model": model, "target": what, "measured": torch_ratio, "met": None})
            for per_tensor, bucketed in (("zl_sg", "zl_sg_bv"), ("zl_flat", "zl_flat_bv")):
                value = paired_ratio(results, per_tensor, bucketed, "exchange_s")
                if value is not None:
                    what = f"exchange time {per_tensor} ÷ {bucketed} ≥ 1.5 (bucket view faster)"
                    targets.append(_target(model, what, value, value >= 1.5))
    return targets


def _target(model: str, what: str, value: float, met: bool) -> dict[str, Any]:
    return {"model": model, "target": what, "measured": value, "met": bool(met)}


# --------------------------------------------------------------------------- transport check
def collectives_rank(sizes: list[int], repeats: int) -> dict[str, float]:
    """Median ms to bring every rank's part of a model-sized fp32 buffer to all ranks, 3 ways.

    The same bytes each time: one ``all_gather_into_tensor`` into the buffer (flat's
    exchange); one broadcast per rank of its contiguous segment (bucket-view
    broadcast); one broadcast per parameter from its sorted-greedy owner (per tensor).
    """
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    buffer = torch.randn(sum(sizes))
    chunk = buffer.numel() // world
    buffer = buffer[: chunk * world]
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    tensors = list(torch.randn(sum(sizes)).split(sizes))
    owners = SortedGreedy.assign(sizes, [0] * len(sizes), world)

    def broadcast_all(pairs: list[tuple[torch.Tensor, int]]) -> None:
        for work in [dist.broadcast(t, src=src, async_op=True) for t, src in pairs]:
            work.wait()

    ways = {
        "all_gather_into_tensor": lambda: all_gather(buffer, buffer[rank * chunk : (rank + 1) * chunk]),
        "one broadcast per rank": lambda: broadcast_all(
            [(buffer[r * chunk : (r + 1) * chunk], r) for r in range(world)]
        ),
        "one broadcast per tensor": lambda: broadcast_all(list(zip(tensors, owners))),
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


def check_collectives(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Print how long Gloo takes to move each model's bytes with each collective pattern."""
    from zero_lab.runtime.launch import run_world

    rows = []
    print("| model | W | MiB | all_gather_into_tensor ms | one broadcast per rank ms | one broadcast per tensor ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for model_name in args.models:
        with torch.device("meta"):
            sizes = [p.numel() for p in MODELS[model_name].build().parameters()]
        for world_size in args.world_sizes:
            times = run_world(collectives_rank, world_size, (sizes, args.steps), start_method=args.start_method)
            worst = {k: max(t[k] for t in times) for k in times[0]}
            rows.append({"model": model_name, "world_size": world_size, "ms": worst})
            cells = " | ".join(f"{v:.1f}" for v in worst.values())
            print(f"| {model_name} ({len(sizes)} tensors) | {world_size} | {4 * sum(sizes) / MIB:.0f} | {cells} |")
    return rows


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer layers and steps (≈ 2 min on 2 cores)")
    parser.add_argument("--world-sizes", type=int, nargs="+", help="default: 1 2 (quick) or 1 2 4")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), help="default: tutorial lm (or -quick)")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), help="default: all available")
    parser.add_argument("--warmup", type=int, help="untimed iterations per strategy (default 2)")
    parser.add_argument("--steps", type=int, help="timed iterations per strategy (default 8 quick / 20)")
    parser.add_argument("--memory-budget", type=float, default=0.6, help="share of MemAvailable a round may use")
    parser.add_argument("--out", type=Path, help="JSON path (default outputs/bench/bench-<mode>-<time>.json)")
    parser.add_argument("--start-method", default="forkserver", choices=["spawn", "forkserver"])
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per world")
    parser.add_argument("--report", type=Path, help="re-print the tables of a saved JSON instead of measuring")
    parser.add_argument("--collectives", action="store_true", help="only time Gloo's transports on the models' bytes")
    args = parser.parse_args(argv)
    args.world_sizes = args.world_sizes or ([1, 2] if args.quick else [1, 2, 4])
    args.models = args.models or (["tutorial-quick", "lm-quick"] if args.quick else ["tutorial", "lm"])
    args.warmup = 2 if args.warmup is None else args.warmup
    args.steps = args.steps or (8 if args.quick else 20)
    return args


def machine() -> dict[str, Any]:
    ok, fairscale = fairscale_status()
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        revision = ""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "mem_available_gib": available_bytes() / 2**30,
        "fairscale": fairscale,
        "fairscale_ok": ok,
        "git_revision": revision,
        "backend": "gloo",
        "threads_per_rank": 1,
    }


def planned_need(model_name: str, world_size: int, strategies: Sequence[str]) -> dict[str, int]:
    """Bytes per rank to have free before the memory phase builds each strategy (planner × 1.5)."""
    return {n: 3 * strategy_cost_bytes(model_name, n, world_size) // 2 for n in strategies}


def schedule(
    args: argparse.Namespace, world_size: int, measured: dict[str, dict[str, Any]]
) -> tuple[list[list[str]], dict[str, int], str]:
    """Timing rounds for one model from the *measured* peaks of the memory phase.

    A strategy's cost is the sum over ranks of its peak RSS Δ (everything it added,
    transients included, so the sum over a round over-counts transients: margin for
    the allocator). Returns the rounds, each strategy's per-rank need, and a note.
    """
    cost = {n: sum(m["peak_rss_delta_bytes"] or 0 for m in ranks) for n, ranks in measured.items() if None not in ranks}
    names = list(cost)
    need = {n: max(m["peak_rss_delta_bytes"] or 0 for m in measured[n]) for n in names}
    resident = max((sum(m["rss_base_bytes"] for m in measured[n]) for n in names), default=0)  # runtime + template
    rounds, dropped = plan_rounds(names, cost.__getitem__, int(args.memory_budget * available_bytes()) - resident)
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


def run_world_size(args: argparse.Namespace, world_size: int, strategies: list[str]) -> list[dict[str, Any]]:
    """Two worlds for ``world_size``: memory (every model), then timing rounds planned from it."""
    from zero_lab.runtime.launch import run_world

    world = {"timeout_s": args.timeout, "deadline_s": args.timeout + 30, "start_method": args.start_method}
    need = {m: planned_need(m, world_size, strategies) for m in args.models}
    job = RankJob("memory", tuple(args.models), tuple(strategies), args.warmup, args.steps, need=need)
    started = time.perf_counter()
    memory = run_world(bench_rank, world_size, (job,), **world)
    plans = {}
    for model_name in args.models:
        measured = {n: [r[model_name][n] for r in memory] for n in strategies}
        plans[model_name] = schedule(args, world_size, measured)
    timing_job = replace(
        job, phase="timing", rounds={m: p[0] for m, p in plans.items()}, need={m: p[1] for m, p in plans.items()}
    )
    timing = run_world(bench_rank, world_size, (timing_job,), **world)
    elapsed = time.perf_counter() - started
    return [
        summarize_run(model_name, world_size, strategies, memory, timing, plans[model_name], elapsed)
        for model_name in args.models
    ]


def summarize_run(
    model_name: str,
    world_size: int,
    strategies: list[str],
    memory: list[dict[str, Any]],
    timing: list[dict[str, Any]],
    plan: tuple[list[list[str]], dict[str, int], str],
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
    return {
        "model": model_name,
        "description": MODELS[model_name].description,
        "world_size": world_size,
        "model_numel": sum(p.numel() for p in model.parameters()),
        "model_bytes": model_bytes,
        "rounds": [r["strategies"] for r in timing[0][model_name] if r["strategies"]] if timing else rounds,
        "note": note,
        "world_seconds": elapsed,
        "results": results,
        "table": summarize(results, model_bytes, planned_state(model_name, world_size, strategies)),
    }


def print_run(run: dict[str, Any]) -> None:
    print(f"\n### {run['model']}, W={run['world_size']} — {run['description']}; {run['model_numel']:,} parameters")
    if run["note"]:
        print(f"({run['note']})")
    print("\n" + format_table(run["table"], MEMORY_COLUMNS))
    if run["rounds"]:
        print(f"\ntiming rounds: {run['rounds']}\n")
        print(format_table(run["table"], SPEED_COLUMNS))


def print_targets(targets: list[dict[str, Any]]) -> None:
    print("\n### Targets (W=2)")
    for t in targets:
        verdict = "info" if t["met"] is None else "met" if t["met"] else "MISSED"
        print(f"- {verdict}: {t['model']}: {t['target']}: {t['measured']:.3f}")


def rerender(path: Path) -> dict[str, Any]:
    """Print the tables and targets of a saved run again, recomputed from its raw figures."""
    report = json.loads(path.read_text())
    print(f"$ {report['command']}   (re-rendered from {path})")
    for run in report["runs"]:
        names = [n for n in run["results"] if n in STRATEGIES]
        planned = planned_state(run["model"], run["world_size"], names)
        run["table"] = summarize(run["results"], run["model_bytes"], planned)
        print_run(run)
    report["targets"] = evaluate_targets(report["runs"], report["runs"][0]["model"])
    print_targets(report["targets"])
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report:
        return rerender(args.report)
    if args.collectives:
        return {"collectives": check_collectives(args)}
    info = machine()
    strategies = args.strategies or [n for n in STRATEGIES if n != "fairscale_oss" or info["fairscale_ok"]]
    command = "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(
        f"$ {command}\n# torch {info['torch']}, {info['cpu_count']} CPUs, Gloo, 1 thread per rank; "
        f"FairScale: {info['fairscale']}",
        flush=True,
    )
    runs = []
    for world_size in args.world_sizes:
        for run in run_world_size(args, world_size, strategies):
            runs.append(run)
            print_run(run)
    targets = evaluate_targets(runs, args.models[0])
    print_targets(targets)
    report = {
        "command": command,
        "mode": "quick" if args.quick else "full",
        "machine": info,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "strategies": {n: asdict(STRATEGIES[n]) for n in strategies},
        "runs": runs,
        "targets": targets,
    }
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "outputs" / "bench" / f"bench-{report['mode']}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nraw figures: {out}")
    return report


if __name__ == "__main__":
    main()
