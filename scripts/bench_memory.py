"""Peak resident memory that training adds per rank, measured, beside the planner's prediction.

Each variant runs in fresh processes of its own (W Gloo ranks, ``spawn``), so no variant's
allocations or allocator caches colour another's. On every rank: run the variant for two steps on
2 × Linear(8) and drop it (the warm-up: the library code training executes is paged in and its
threads started, so ≈ 7 MiB of first-executed code is not counted as the model's memory); build
the model, the wrapper and the optimizer; reset the kernel's peak-RSS counter
(``/proc/self/clear_refs`` ← 5) and read ``VmRSS``; train ``--steps`` steps; read ``VmHWM``. The
figure is ``VmHWM − VmRSS before the first step``: what training itself added at its peak
(gradients, buckets, optimizer state, communication buffers, activations, temporaries), not what
the code reports about itself.

The ranks run with glibc's mmap threshold fixed at 64 KiB (``MALLOC_MMAP_THRESHOLD_``): every tensor
block is mapped when allocated and unmapped when freed, so RSS follows the live tensors. With
glibc's default (``--default-malloc``) the threshold rises to the largest block freed and up to twice
that stays in the heap after a free — a run-dependent slack (ranks of one run differ by 10 MiB) that
no plan of the tensors can predict. ``--no-warm-up`` measures from a cold process.

    python scripts/bench_memory.py                     # 12 × Linear(768), W=2, 6 steps
    python scripts/bench_memory.py --layers 20 --width 2000 --batch 20

Variants: DDP + Adam; DDP with ``gradient_as_bucket_view``; torch's ZeroRedundancyOptimizer on
DDP; zero_lab's ZeroRedundancyOptimizer on DDP (defaults, and ``exchange=broadcast``); the engine
(``zero_lab.ShardedDataParallel``, defaults: on this one x86-64 host through shared memory; and
``engine_gloo``, its point-to-point modes over Gloo); FSDP2 (``fully_shard`` per layer); DeepSpeed
ZeRO-1/2 as ``zero_lab.bench`` builds them (client ``torch.optim.Adam``, CPU, Gloo), where installed
(``make bench-deps``; skipped with the reason otherwise). The planner's column is
:mod:`zero_lab.peak`'s plan per rank: :func:`zero_lab.planner.plan_memory`'s gradients + DDP buckets +
optimizer state (the engine: its state plus its layout's gradient bound, owned + two buckets, and
the mailboxes' pages it touches) plus the activations, the gradient being produced, the receive
buffers and the optimizer's temporaries; the error column is (measured − planned) ÷ planned per rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

import torch
import torch.distributed as dist
from torch import nn

from zero_lab.peak import PeakPlan
from zero_lab.runtime.spawn import run_world

MIB = 2**20
#: glibc's mmap threshold, fixed (which also turns its dynamic raising off): every block from 64 KiB up
#: is mapped on allocation and unmapped on free, so RSS follows the live tensors and a freed gradient
#: is not counted again as heap the allocator keeps (see the module docstring)
MMAP_THRESHOLD = 65536
VARIANTS = (
    "ddp",
    "ddp_bucket_view",
    "torch_zero",
    "zero_lab_ddp",
    "zero_lab_ddp_broadcast",
    "engine",
    "engine_gloo",
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
    if variant in ("engine", "engine_gloo"):
        from zero_lab import ShardedDataParallel

        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        # engine: its defaults (on one x86-64 host, through shared memory, whose mailboxes count in RSS);
        # engine_gloo: the point-to-point modes over Gloo, named
        gloo = {"grad_reduce": "reduce_scatter", "exchange": "p2p_all_gather"} if variant == "engine_gloo" else {}
        engine = ShardedDataParallel(model, optimizer, **gloo)
        return engine, optimizer, engine
    if variant == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), None
    raise ValueError(f"unknown variant {variant!r}")


def _deepspeed(variant: str, model: nn.Module) -> tuple[nn.Module, Any, Any]:
    """DeepSpeed ZeRO-1 / ZeRO-2 as the benchmark library builds it (client ``torch.optim.Adam``, fp32, on
    CPU over this Gloo world): ``(forward, optimizer-like with step/zero_grad, engine.backward)``."""
    from zero_lab.bench.strategies import STRATEGIES

    runner = STRATEGIES["deepspeed_z1" if variant.endswith("1") else "deepspeed_z2"].build(model)
    return runner.forward, runner.optimizer, runner.backward


def _variant(variant: str, model: nn.Module) -> tuple[nn.Module, Any, Any, Any]:
    """``(module to call, optimizer, backward or None, closer or None)`` of one variant."""
    if variant.startswith("deepspeed"):
        return (*_deepspeed(variant, model), None)
    wrapped, optimizer, closer = _build(variant, model)
    return wrapped, optimizer, None, closer


def _train(wrapped: nn.Module, optimizer: Any, backward: Any, x: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = wrapped(x).pow(2).mean()
        if backward is None:
            loss.backward()
        else:
            backward(loss)
        optimizer.step()


def _warm_up(variant: str) -> None:
    """Two steps of the variant on 2 × Linear(8), then dropped: the code it runs (torch's, Gloo's,
    DeepSpeed's JIT-built op) is paged in and its threads started before the measurement, so the
    measured peak is the model's tensors, not first-executed library code (≈ 7 MiB of file pages)."""
    model = _model(2, 8)
    wrapped, optimizer, backward, closer = _variant(variant, model)
    _train(wrapped, optimizer, backward, torch.ones(4, 8), 2)
    if closer is not None:
        closer.close()
    del model, wrapped, optimizer, backward, closer
    gc.collect()


def rank_program(variant: str, layers: int, width: int, batch: int, steps: int, warm: bool) -> dict[str, Any]:
    """One rank of one variant: what training added to the peak RSS, in bytes."""
    rank = dist.get_rank()
    if warm:
        _warm_up(variant)
    model = _model(layers, width)
    wrapped, optimizer, backward, closer = _variant(variant, model)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank))
    gc.collect()
    reset = _reset_peak()
    before = _status("VmRSS")
    _train(wrapped, optimizer, backward, x, steps)
    peak = _status("VmHWM")
    if closer is not None:
        closer.close()
    dist.barrier()
    return {"added": peak - before, "before": before, "peak_reset": reset}


def planned(variant: str, layers: int, width: int, batch: int, world: int) -> list[PeakPlan] | None:
    """The planner's peak that training adds, per rank (:mod:`zero_lab.peak`): what the plan holds
    (gradients + DDP buckets + state; the engine: state + its layout's gradient bound) plus the
    activations, the gradient being produced, the receive buffers and the optimizer's workspace."""
    from zero_lab.engine.layout import plan_buckets
    from zero_lab.engine.wrapper import BUCKET_CAP_MB
    from zero_lab.partition import Flat, SortedGreedy
    from zero_lab.peak import engine_peak, peak_of_plan, saved_activation_bytes
    from zero_lab.planner import plan_memory, specs_from_module

    with torch.device("meta"):
        model = _model(layers, width)
        x = torch.empty(batch, width)
    specs = specs_from_module(model)
    activations = saved_activation_bytes(lambda: model(x).pow(2).mean(), model.parameters())
    if variant in ("ddp", "ddp_bucket_view"):
        plan = plan_memory(specs, world, None, gradient_as_bucket_view=variant == "ddp_bucket_view")
    elif variant in ("torch_zero", "zero_lab_ddp", "zero_lab_ddp_broadcast"):
        plan = plan_memory(specs, world, SortedGreedy())
    elif variant in ("engine", "engine_gloo"):
        plan = plan_memory(specs, world, Flat())
        # the engine's default here goes through shared memory (x86-64, one host: the benchmark's ranks)
        shm = variant == "engine" and platform.machine().lower() in ("x86_64", "amd64")
        buckets = plan_buckets(specs, world, Flat(), BUCKET_CAP_MB)
        return engine_peak(plan, specs, buckets, activations, "shm_reduce_scatter" if shm else "reduce_scatter")
    else:
        return None
    return peak_of_plan(plan, specs, activations)


def _skip_reason(variant: str) -> str | None:
    if variant.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (make bench-deps installs it, torch kept at 2.13.0)"
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
    parser.add_argument("--no-warm-up", action="store_true", help="measure from a cold process (code pages count)")
    parser.add_argument("--default-malloc", action="store_true", help="glibc's dynamic mmap threshold (slack counts)")
    args = parser.parse_args()
    if not args.default_malloc:  # read by each rank's C library at its start (spawned interpreters)
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    psi = args.layers * (args.width * args.width + args.width) * 4
    print(
        f"{args.layers} × Linear({args.width}) (Ψ = {psi / MIB:.1f} MiB), batch {args.batch}, W={args.world}, "
        f"{args.steps} steps; warm-up {'off' if args.no_warm_up else 'on'}, "
        f"malloc {'default' if args.default_malloc else f'MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}'}"
    )
    print(f"{'variant':<24} {'added per rank (MiB)':>22} {'planned (MiB)':>16} {'error':>16} {'÷ DDP':>6}")
    rows, ddp = [], None
    for variant in args.variants:
        reason = _skip_reason(variant)
        if reason:
            print(f"{variant:<24} skipped: {reason}")
            rows.append({"variant": variant, "skipped": reason})
            continue
        try:
            results = run_world(
                rank_program,
                args.world,
                (variant, args.layers, args.width, args.batch, args.steps, not args.no_warm_up),
                timeout_s=300,
            )
        except Exception as error:  # one variant failing (e.g. FSDP2 on this torch) does not end the table
            print(f"{variant:<24} failed: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
            rows.append({"variant": variant, "failed": str(error).splitlines()[0]})
            continue
        added = [r["added"] for r in results]
        ddp = max(added) if variant == "ddp" else ddp
        plans = planned(variant, args.layers, args.width, args.batch, args.world)
        plan = [p.total for p in plans] if plans else None
        errors = [(a - p) / p for a, p in zip(added, plan)] if plan else None
        ratio = f"{max(added) / ddp:.2f}" if ddp else "—"
        shown = " / ".join(f"{a / MIB:.1f}" for a in added)
        plan_text = " / ".join(f"{p / MIB:.1f}" for p in plan) if plan else "—"
        error_text = " / ".join(f"{e:+.1%}" for e in errors) if errors else "—"
        print(f"{variant:<24} {shown:>22} {plan_text:>16} {error_text:>16} {ratio:>6}")
        rows.append(
            {
                "variant": variant,
                "added": added,
                "planned": plan,
                "planned_terms": [dataclasses.asdict(p) for p in plans] if plans else None,
                "error": errors,
                "peak_reset": all(r["peak_reset"] for r in results),
            }
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
