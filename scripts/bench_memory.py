"""Peak resident memory that training adds per rank, measured, beside the planner's prediction.

Each variant runs in fresh processes of its own (W Gloo ranks, ``spawn``), so no variant's
allocations or allocator caches colour another's. On every rank: build the model, the wrapper and
the optimizer; reset the kernel's peak-RSS counter (``/proc/self/clear_refs`` ← 5) and read
``VmRSS``; train ``--steps`` steps; read ``VmHWM``. The figure is ``VmHWM − VmRSS before the first
step``: what training itself added at its peak (gradients, DDP's buckets, optimizer state,
communication buffers, activations), not what the code reports about itself.

    python scripts/bench_memory.py                     # 12 × Linear(768), W=2, 6 steps
    python scripts/bench_memory.py --layers 20 --width 2000 --batch 20

Variants: DDP + Adam; DDP with ``gradient_as_bucket_view``; torch's ZeroRedundancyOptimizer on
DDP; zero_lab's ZeroRedundancyOptimizer on DDP (defaults, and ``exchange=broadcast``); the engine
(``zero_lab.ShardedDataParallel``, defaults); FSDP2 (``fully_shard`` per layer); DeepSpeed
ZeRO-1/2 where installed (skipped with the reason otherwise). The planner's column
(:func:`zero_lab.planner.plan_memory`) is gradients + DDP buckets + optimizer state per rank; for the
engine, its state plus the gradient bound of its own layout (owned + two buckets).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

import torch
import torch.distributed as dist
from torch import nn

from zero_lab.runtime.spawn import run_world

MIB = 2**20
VARIANTS = (
    "ddp",
    "ddp_bucket_view",
    "torch_zero",
    "zero_lab_ddp",
    "zero_lab_ddp_broadcast",
    "engine",
    "fsdp2",
    "deepspeed_zero1",
    "deepspeed_zero2",
)


def _status(key: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> bool:
    """Reset the kernel's peak RSS to the current RSS (Linux ≥ 4.0); ``False`` where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _build(variant: str, model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """``(module to call, optimizer, closer)`` of one variant."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if variant in ("ddp", "ddp_bucket_view"):
        wrapped = DDP(model, gradient_as_bucket_view=variant == "ddp_bucket_view")
        return wrapped, torch.optim.Adam(model.parameters(), lr=1e-3), None
    if variant == "torch_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

        wrapped = DDP(model)
        return wrapped, TorchZero(model.parameters(), torch.optim.Adam, lr=1e-3), None
    if variant.startswith("zero_lab_ddp"):
        from zero_lab import ZeroRedundancyOptimizer

        exchange = "broadcast" if variant.endswith("broadcast") else "auto"
        wrapped = DDP(model)
        return wrapped, ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, exchange=exchange, lr=1e-3), None
    if variant == "engine":
        from zero_lab import ShardedDataParallel

        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        engine = ShardedDataParallel(model, optimizer)
        return engine, optimizer, engine
    if variant == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), None
    raise ValueError(f"unknown variant {variant!r}")


def _deepspeed(variant: str, model: nn.Module) -> tuple[Any, Any, Any]:
    import deepspeed  # optional: only where installed

    stage = 1 if variant.endswith("1") else 2
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, optimizer, None


def rank_program(variant: str, layers: int, width: int, batch: int, steps: int) -> dict[str, Any]:
    """One rank of one variant: what training added to the peak RSS, in bytes."""
    rank = dist.get_rank()
    model = _model(layers, width)
    if variant.startswith("deepspeed"):
        wrapped, optimizer, closer = _deepspeed(variant, model)
    else:
        wrapped, optimizer, closer = _build(variant, model)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank))
    gc.collect()
    reset = _reset_peak()
    before = _status("VmRSS")
    for _ in range(steps):
        if variant.startswith("deepspeed"):
            loss = wrapped(x).pow(2).mean()
            wrapped.backward(loss)
            wrapped.step()
            continue
        optimizer.zero_grad(set_to_none=True)
        wrapped(x).pow(2).mean().backward()
        optimizer.step()
    peak = _status("VmHWM")
    if closer is not None:
        closer.close()
    dist.barrier()
    return {"added": peak - before, "before": before, "peak_reset": reset}


def planned(variant: str, layers: int, width: int, world: int) -> float | None:
    """The planner's bytes per rank (max over ranks) that training adds: gradients + DDP buckets + state."""
    from zero_lab.engine.layout import grad_hold_bound, plan_buckets
    from zero_lab.engine.wrapper import BUCKET_CAP_MB
    from zero_lab.partition import Flat, SortedGreedy
    from zero_lab.planner import plan_memory, specs_from_module

    specs = specs_from_module(_model(layers, width))
    if variant in ("ddp", "ddp_bucket_view"):
        plan = plan_memory(specs, world, None, gradient_as_bucket_view=variant == "ddp_bucket_view")
    elif variant in ("torch_zero", "zero_lab_ddp", "zero_lab_ddp_broadcast"):
        plan = plan_memory(specs, world, SortedGreedy())
    elif variant == "engine":
        plan = plan_memory(specs, world, Flat())
        buckets = plan_buckets(specs, world, Flat(), BUCKET_CAP_MB)
        return max(r.state_bytes + grad_hold_bound(buckets, r.rank) for r in plan.ranks)
    else:
        return None
    return max(r.grad_bytes + r.ddp_buffer_bytes + r.state_bytes for r in plan.ranks)


def _skip_reason(variant: str) -> str | None:
    if variant.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install deepspeed, pinned with torch==2.13.0)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    psi = args.layers * (args.width * args.width + args.width) * 4
    print(f"{args.layers} × Linear({args.width}) (Ψ = {psi / MIB:.1f} MiB), W={args.world}, {args.steps} steps")
    print(f"{'variant':<24} {'added per rank (MiB)':>28} {'planner (MiB)':>14} {'÷ DDP (max rank)':>17}")
    rows, ddp = [], None
    for variant in args.variants:
        reason = _skip_reason(variant)
        if reason:
            print(f"{variant:<24} skipped: {reason}")
            rows.append({"variant": variant, "skipped": reason})
            continue
        try:
            results = run_world(
                rank_program, args.world, (variant, args.layers, args.width, args.batch, args.steps), timeout_s=300
            )
        except Exception as error:  # one variant failing (e.g. FSDP2 on this torch) does not end the table
            print(f"{variant:<24} failed: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
            rows.append({"variant": variant, "failed": str(error).splitlines()[0]})
            continue
        added = [r["added"] for r in results]
        ddp = max(added) if variant == "ddp" else ddp
        plan = planned(variant, args.layers, args.width, args.world)
        ratio = f"{max(added) / ddp:.2f}" if ddp else "—"
        shown = " / ".join(f"{a / MIB:.1f}" for a in added)
        plan_text = f"{plan / MIB:.1f}" if plan else "—"
        print(f"{variant:<24} {shown:>28} {plan_text:>14} {ratio:>17}")
        rows.append(
            {"variant": variant, "added": added, "planned": plan, "peak_reset": all(r["peak_reset"] for r in results)}
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
