"""The Muon benchmark: DDP + chained Muon/AdamW against torch's and zero_lab's ZeRO-1.

One world of W Gloo ranks (one thread each) trains four copies of one transformer LM
(:class:`~zero_lab.app.workloads.models.TinyLM` with grouped-query K/V and narrow experts: mixed
aspect ratios; the LM head tied to a 4096 × 128 token embedding) from the same initial
weights on the same batches, one iteration of each strategy in turn per step, so load on
the machine hits them alike. The param groups are in the model's order (``--order
model``: the AdamW group, which holds the embedding, first — as a user listing groups
module by module would) or Muon's first (``--order muon_first``, as
:func:`~zero_lab.routing.muon_param_groups` returns them). Sorted-greedy goes group by
group, so by numel the embedding's rank gets no Muon matrix until the others have caught
up with its elements: with a tied embedding larger than all matrices together, one rank
does all Newton–Schulz work.

* ``ddp_muon`` — DDP + ``torch.optim.Muon`` on the hidden matrices chained with AdamW on
  the rest (:func:`~zero_lab.routing.muon_param_groups`); every rank runs Newton–Schulz on
  every matrix;
* ``torch_zero`` — torch's ``ZeroRedundancyOptimizer`` takes one optimizer class, and
  Muon refuses anything but 2-D matrices, so it wraps ``Muon`` on the hidden matrices only
  (numel-balanced, torch's sorted-greedy) and a plain AdamW, replicated on every rank,
  steps the rest;
* ``zl_numel`` / ``zl_cost`` — zero_lab's ZeroRedundancyOptimizer over both groups (one
  local optimizer per class, parameters as bucket views: one broadcast per rank's buffer),
  ``SortedGreedy()`` / ``SortedGreedy(cost="newton_schulz")``;
  ``zl_time`` — the same with a user cost, :func:`cpu_step_ns`, a step-time model measured on
  this machine (a fixed cost per tensor plus the work), as ``cost=`` accepts any callable;
  ``zl_cost_rs`` — ``zl_cost`` with :func:`~zero_lab.grad_reduce.reduce_gradients`
  (``reduce_scatter``): each matrix's gradient goes to its owner only;
* ``zl_engine`` — zero_lab's own data-parallel engine (:class:`~zero_lab.ShardedDataParallel`, no
  DDP) around a :class:`~zero_lab.chained.ChainedOptimizer` of the same two groups, owners by
  Newton–Schulz cost: each matrix's gradient reaches its owner in the engine's buckets, the owner
  steps it whole, the buckets' parameters are gathered inside ``step()`` (``prefetch=False``: a
  prefetched gather would run behind the other strategies' turns in this interleaved benchmark,
  not behind its own forward, and look free);
* ``ddp_muon_aa`` — ``ddp_muon`` again, the A/A control: its ratio to ``ddp_muon`` is the noise band
  of every other ratio;
* ``zl_engine`` runs the engine's default modes: on one x86-64 host with CPU tensors, through host
  shared memory (:mod:`zero_lab.host_shm`: ``shm_reduce_scatter`` + ``shm_all_gather``);
  ``zl_engine_gloo`` names the point-to-point modes over Gloo, and ``ddp_muon_shm`` is the control,
  DDP + Muon whose all-reduce is the ``shm_all_reduce`` comm hook, so the transport's share of the gain
  shows.

Per strategy: each rank's local optimizer step (the step without the parameter exchange:
Muon + AdamW for DDP; torch's inner ``optim.step`` + the replicated AdamW; zero_lab's
``local_step_seconds``; the engine's ``local_step_seconds``: the owners' step, without the
reductions its step pre-hook finishes or the all-gathers its post-hook issues and waits), the
slowest rank ÷ the mean (median over steps), the iteration (zero_grad + forward + backward +
step, slowest rank, median), state bytes per rank, and parity: the largest |parameter − DDP's|
after the run (0.0 = bitwise)::

    python scripts/bench_muon.py --world-sizes 2 4 --steps 12
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ShardedDataParallel, SortedGreedy, ZeroRedundancyOptimizer, muon_param_groups, reduce_gradients
from zero_lab.app.workloads.models import TinyLM
from zero_lab.chained import GROUP_CLASS_KEY, ChainedOptimizer
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import ParamSpec, newton_schulz_cost
from zero_lab.runtime.spawn import run_world

__all__ = ["MODEL", "STRATEGIES", "cpu_step_ns", "lm", "main", "muon_rank", "partition_costs", "render", "summarize"]

#: The benchmark model: TinyLM arguments (1.15 M parameters with the head tied to the embedding;
#: grouped-query K/V 4x narrower than Q, 4 experts of 32 x 128 beside each MLP).
MODEL: dict[str, Any] = {
    "vocab_size": 4096,
    "seq_len": 64,
    "d_model": 128,
    "n_layer": 3,
    "n_head": 8,
    "n_kv_head": 2,
    "n_expert": 4,
    "expert_dim": 32,
}
MUON = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.1}
ADAMW = {"lr": 3e-3, "weight_decay": 0.1}
BATCH = 8  # sequences per rank per step
STRATEGIES = (
    "ddp_muon",
    "ddp_muon_aa",
    "ddp_muon_shm",
    "torch_zero",
    "zl_numel",
    "zl_cost",
    "zl_time",
    "zl_cost_rs",
    "zl_engine",
    "zl_engine_gloo",
)
#: the engine's point-to-point modes over Gloo, named (its defaults go through host shared memory here)
GLOO_MODES = {"grad_reduce": "reduce_scatter", "exchange": "p2p_all_gather"}


def cpu_step_ns(spec: ParamSpec) -> float:
    """Nanoseconds one tensor's step takes, as measured on the 2-core benchmark machine (one
    thread, fastest of 30 steps of one tensor; docs/benchmarks.md has the command): Muon
    about 0.35 ms per matrix plus 0.05 ns per Newton–Schulz unit (bf16), AdamW about 0.04 ms
    per tensor plus 4 ns per element. A cost for ``SortedGreedy(cost=cpu_step_ns)``."""
    if spec.elementwise:
        return 40_000 + 4 * spec.numel
    return 350_000 + 0.05 * newton_schulz_cost(spec)


@dataclass
class _Row:
    """One strategy on one rank: its model, optimizers and what it measured."""

    model: nn.Module
    ddp: DDP | ShardedDataParallel
    optimizers: list[torch.optim.Optimizer]
    local: Callable[[], float]  # running seconds of the local step
    iteration_s: list[float] = field(default_factory=list)
    local_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # every optimizer's step(): local step + exchange


def _timed_hooks(optimizer: torch.optim.Optimizer) -> Callable[[], float]:
    total, started = [0.0], [0.0]
    optimizer.register_step_pre_hook(lambda *_: started.__setitem__(0, time.perf_counter()))
    optimizer.register_step_post_hook(lambda *_: total.__setitem__(0, total[0] + time.perf_counter() - started[0]))
    return lambda: total[0]


def lm(model_args: dict[str, Any]) -> TinyLM:
    """The benchmark's TinyLM with its head tied to the token embedding."""
    model = TinyLM(**model_args)
    model.head.weight = model.tok_emb.weight
    return model


def _ordered(matrices: dict[str, Any], rest: dict[str, Any], order: str) -> list[dict[str, Any]]:
    """The two groups in the model's order (the AdamW group first) or Muon's first."""
    return [rest, matrices] if order == "model" else [matrices, rest]


def _build(name: str, template: nn.Module, order: str) -> _Row:
    model = copy.deepcopy(template)
    matrices, rest = muon_param_groups(model, muon=MUON, adamw=ADAMW, named=False)
    if name in ("zl_engine", "zl_engine_gloo"):
        chained = ChainedOptimizer(_ordered(matrices, rest, order), torch.optim.AdamW)
        modes = GLOO_MODES if name == "zl_engine_gloo" else {}
        engine = ShardedDataParallel(
            model, chained, partitioner=SortedGreedy(cost="newton_schulz"), prefetch=False, **modes
        )
        return _Row(model, engine, [chained], lambda: engine.local_step_seconds)  # the owners' step, no gather
    ddp = DDP(model)
    if name in ("ddp_muon", "ddp_muon_aa", "ddp_muon_shm"):
        muon = torch.optim.Muon(matrices["params"], **MUON)
        adamw = torch.optim.AdamW(rest["params"], **ADAMW)
        if name == "ddp_muon_shm":  # the control: DDP's all-reduce over the same shared memory
            reduce_gradients(ddp, muon, "shm_all_reduce")
        clocks = [_timed_hooks(muon), _timed_hooks(adamw)]
        return _Row(model, ddp, [muon, adamw], lambda: sum(c() for c in clocks))
    if name == "torch_zero":
        zero = TorchZero(matrices["params"], torch.optim.Muon, **MUON)
        adamw = torch.optim.AdamW(rest["params"], **ADAMW)
        clocks = [_timed_hooks(zero.optim), _timed_hooks(adamw)]
        return _Row(model, ddp, [zero, adamw], lambda: sum(c() for c in clocks))
    cost = {"zl_cost": "newton_schulz", "zl_cost_rs": "newton_schulz", "zl_time": cpu_step_ns}.get(name, "numel")
    zero = ZeroRedundancyOptimizer(
        _ordered(matrices, rest, order),
        torch.optim.AdamW,
        partitioner=SortedGreedy(cost=cost),
        parameters_as_bucket_view=True,
    )
    if name == "zl_cost_rs":
        reduce_gradients(ddp, zero, "reduce_scatter")
    return _Row(model, ddp, [zero], lambda: zero.local_step_seconds)


def _iteration(row: _Row, tokens: torch.Tensor) -> None:
    before, start = row.local(), time.perf_counter()
    for optimizer in row.optimizers:
        optimizer.zero_grad(set_to_none=True)
    logits = row.ddp(tokens[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
    stepping = time.perf_counter()
    for optimizer in row.optimizers:
        optimizer.step()
    row.step_s.append(time.perf_counter() - stepping)
    row.iteration_s.append(time.perf_counter() - start)
    row.local_s.append(row.local() - before)


def muon_rank(
    model_args: dict[str, Any], strategies: Sequence[str], warmup: int, steps: int, order: str, batch: int = BATCH
) -> dict[str, Any]:
    """One rank's program: every strategy, one iteration each per step; returns per-step times and state."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    template = lm(model_args)
    rows = {name: _build(name, template, order) for name in strategies}
    for step in range(warmup + steps):
        tokens = torch.randint(0, model_args["vocab_size"], (batch, model_args["seq_len"] + 1),
                               generator=torch.Generator().manual_seed(1000 * step + rank))  # fmt: skip
        for name in strategies:
            _iteration(rows[name], tokens)
    reference = rows[strategies[0]].model
    out: dict[str, Any] = {}
    for name, row in rows.items():
        out[name] = {
            "iteration_s": row.iteration_s[warmup:],
            "local_s": row.local_s[warmup:],
            "step_s": row.step_s[warmup:],
            "state_bytes": sum(optimizer_state_bytes(o) for o in row.optimizers),
            "max_diff": max((a - b).abs().max().item() for a, b in zip(row.model.parameters(), reference.parameters())),
        }
        if isinstance(row.ddp, ShardedDataParallel):
            row.ddp.close()
    return out


def partition_costs(model_args: dict[str, Any], world_size: int, order: str) -> dict[str, float]:
    """Newton–Schulz cost imbalance (max ÷ mean) of the numel- and cost-balanced owners, no processes."""
    with torch.device("meta"):
        model = lm(model_args)
    groups = _ordered(*muon_param_groups(model, muon=MUON, adamw=ADAMW, named=False), order)
    specs = [
        ParamSpec.of(p, group=g, elementwise=GROUP_CLASS_KEY not in group)
        for g, group in enumerate(groups)
        for p in group["params"]
    ]
    costs: dict[str, Any] = {"numel": "numel", "newton_schulz": "newton_schulz", "cpu_step_ns": cpu_step_ns}
    out = {
        name: SortedGreedy(cost=cost)(specs, world_size).report(cost="newton_schulz").cost_imbalance
        for name, cost in costs.items()
    }
    out["cpu_step_ns_by_model"] = SortedGreedy(cost=cpu_step_ns)(specs, world_size).report().cost_imbalance
    return out


def summarize(per_rank: list[dict[str, Any]], strategies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per strategy: median local step per rank, slowest ÷ mean, iteration, state per rank, parity."""
    out = {}
    for name in strategies:
        ranks = [r[name] for r in per_rank]
        steps = len(ranks[0]["local_s"])
        local = [[r["local_s"][s] for r in ranks] for s in range(steps)]
        out[name] = {
            "local_ms": [1000 * statistics.median(r["local_s"]) for r in ranks],
            "slowest_over_mean": statistics.median(max(s) / (sum(s) / len(s)) for s in local),
            "iteration_ms": 1000 * statistics.median(max(r["iteration_s"][s] for r in ranks) for s in range(steps)),
            # where the time went, slowest rank's medians: forward + backward, and step() beyond the local step
            "fwd_bwd_ms": 1000
            * max(statistics.median(i - t for i, t in zip(r["iteration_s"], r["step_s"])) for r in ranks),
            "exchange_ms": 1000
            * max(statistics.median(t - x for t, x in zip(r["step_s"], r["local_s"])) for r in ranks),
            "state_bytes": [r["state_bytes"] for r in ranks],
            "max_diff": max(r["max_diff"] for r in ranks),
        }
    return out


LABELS = {
    "ddp_muon": "DDP + Muon/AdamW",
    "torch_zero": "torch ZeRO(Muon on matrices) + replicated AdamW",
    "zl_numel": "zero_lab, numel-balanced",
    "zl_cost": "zero_lab, cost-balanced (newton_schulz)",
    "zl_time": "zero_lab, cost=cpu_step_ns (measured time model)",
    "zl_cost_rs": "zero_lab, cost-balanced, grad_reduce=reduce_scatter",
    "zl_engine": "zero_lab's engine (ShardedDataParallel), cost-balanced, its default modes",
    "ddp_muon_aa": "DDP + Muon/AdamW again (the A/A control: the noise band)",
    "ddp_muon_shm": "DDP + Muon/AdamW, its all-reduce over host shared memory (control)",
    "zl_engine_gloo": "zero_lab's engine, cost-balanced, point-to-point over Gloo",
}


def render(world_size: int, summary: dict[str, dict[str, Any]], costs: dict[str, float]) -> str:
    """A markdown table of one world size."""
    ddp = summary["ddp_muon"]["iteration_ms"] if "ddp_muon" in summary else None
    lines = [
        f"W={world_size}; Newton–Schulz cost max÷mean of the owners (partition report): "
        f"numel-balanced {costs['numel']:.3f}, cost-balanced {costs['newton_schulz']:.3f}, "
        f"cpu_step_ns-balanced {costs['cpu_step_ns']:.3f} (by its own model {costs['cpu_step_ns_by_model']:.3f})",
        "",
        "| strategy | local step per rank, ms | slowest ÷ mean | iteration ms | ÷ DDP | fwd+bwd ms | "
        "step − local ms | state per rank, KiB | max \\|Δ param\\| vs DDP |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, row in summary.items():
        ratio = f"{row['iteration_ms'] / ddp:.2f}" if ddp else "–"
        lines.append(
            f"| {LABELS[name]} | {' / '.join(f'{v:.1f}' for v in row['local_ms'])} | {row['slowest_over_mean']:.2f} | "
            f"{row['iteration_ms']:.1f} | {ratio} | {row['fwd_bwd_ms']:.1f} | {row['exchange_ms']:.1f} | "
            f"{' / '.join(f'{b / 1024:.0f}' for b in row['state_bytes'])} | "
            f"{row['max_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[int, dict[str, Any]]:
    parser = argparse.ArgumentParser(description="Muon + AdamW: DDP vs torch's and zero_lab's ZeRO-1 and its engine")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=12, help="timed iterations per strategy")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--d-model", type=int, default=MODEL["d_model"])
    parser.add_argument("--n-layer", type=int, default=MODEL["n_layer"])
    parser.add_argument("--order", choices=["model", "muon_first"], default="model", help="param groups' order")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per rank per step")
    args = parser.parse_args(argv)
    model_args = MODEL | {"d_model": args.d_model, "n_layer": args.n_layer}
    command = "python scripts/bench_muon.py " + " ".join(sys.argv[1:] if argv is None else argv)
    params = sum(p.numel() for p in lm(model_args).parameters())
    print(
        f"$ {command}\n# torch {torch.__version__}, TinyLM {model_args}, head tied ({params / 1e6:.2f} M "
        f"parameters), groups in {args.order} order, {args.batch} sequences per rank, Gloo, 1 thread per rank"
    )
    results = {}
    for world_size in args.world_sizes:
        per_rank = run_world(
            muon_rank,
            world_size,
            (model_args, args.strategies, args.warmup, args.steps, args.order, args.batch),
            timeout_s=3600,
        )
        summary = summarize(per_rank, args.strategies)
        costs = partition_costs(model_args, world_size, args.order)
        print("\n" + render(world_size, summary, costs), flush=True)
        results[world_size] = {"summary": summary, "costs": costs}
    return results
