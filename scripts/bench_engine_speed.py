"""The engine's iteration beside DDP + Adam, paired, with an A/A control.

All variants live in the same W Gloo ranks and take turns in a rotating order (each variant its
own copy of the model and optimizer). A turn is one untimed step after a barrier, then
``--block`` consecutive steps timed together, then — for the engine, untimed — the wait for the
last step's parameter gathers (``wait_for_params``). So every timed step pays exactly one
step's gathers (those of the step before it, waited in its forward: the steady state of
training with prefetch), and no gather runs on behind another variant's turn, where it would
look free. The slowest rank's timed block ÷ ``--block`` counts. Each round gives every
variant's ratio to DDP's step of that round; the figure is the median over rounds, beside the
A/A control (a second DDP + Adam, the noise of the measure). No asserts: a measurement to quote
with its command, and under load to label as such. Each rank keeps freed memory in its heap
(:func:`zero_lab.bench.host.keep_freed_memory`, as the benchmark's timing phases), so no step
faults its temporaries' pages back in. The engine runs with its default 4 MiB buckets, and
prefetched once more per ``--caps`` value: bucket size trades the gradient memory bound
(Ψ/W + two buckets) for fewer collective waits per step.

    python scripts/bench_engine_speed.py                          # 12 × Linear(768), batch 16, 30 rounds
    python scripts/bench_engine_speed.py --caps 8 14 28           # the prefetched engine at three more caps
    python scripts/bench_engine_speed.py --layers 20 --width 2000 --batch 20 --rounds 6
    python scripts/bench_engine_speed.py --device cuda --world 1   # NCCL on one GPU (W=2: Gloo, one GPU)

On CUDA each step is timed with CUDA events on the current stream (the host returns before the
kernels and the NCCL collectives finish).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab.bench.host import keep_freed_memory
from zero_lab.runtime.spawn import run_world

BASE_VARIANTS = ("ddp", "ddp_aa", "engine", "engine_prefetch", "engine_sorted_greedy")


def variants(caps: list[float]) -> tuple[str, ...]:
    """The base variants, then the prefetched engine once per extra bucket cap (``engine_prefetch_cap14``)."""
    return BASE_VARIANTS + tuple(f"engine_prefetch_cap{cap:g}" for cap in caps)


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _build(variant: str, layers: int, width: int, device: str) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    from zero_lab import ShardedDataParallel, SortedGreedy

    model = _model(layers, width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    if variant.startswith("ddp"):
        return DDP(model, device_ids=[0] if device == "cuda" else None), optimizer, None
    partitioner = SortedGreedy() if variant.endswith("sorted_greedy") else None
    cap = {"bucket_cap_mb": float(variant.rpartition("_cap")[2])} if "_cap" in variant else {}
    engine = ShardedDataParallel(model, optimizer, prefetch="prefetch" in variant, partitioner=partitioner, **cap)
    return engine, optimizer, engine


def _timer(device: str) -> Any:
    """``start() -> stop() -> seconds``: CUDA events on the current stream, else the host clock."""
    if device == "cuda":

        def start_cuda() -> Any:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()

            def stop() -> float:
                end.record()
                end.synchronize()
                return begin.elapsed_time(end) / 1e3

            return stop

        return start_cuda

    def start_host() -> Any:
        begin = time.perf_counter()
        return lambda: time.perf_counter() - begin

    return start_host


def _step(wrapped: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    wrapped(x).pow(2).mean().backward()
    optimizer.step()


def rank_program(
    layers: int,
    width: int,
    batch: int,
    rounds: int,
    warmup: int,
    device: str = "cpu",
    caps: tuple[float, ...] = (),
    block: int = 3,
) -> dict[str, list[float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    names = variants(list(caps))
    keep_freed_memory()  # as the benchmark's timing phases: no page faults from one step to the next
    built = {v: _build(v, layers, width, device) for v in names}
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank)).to(device)
    timer = _timer(device)
    times: dict[str, list[float]] = {v: [] for v in names}
    for index in range(warmup + rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for variant in order:
            wrapped, optimizer, engine = built[variant]
            dist.barrier()
            _step(wrapped, optimizer, x)  # untimed: its forward has no gather of a previous step to wait for
            stop = timer()
            for _ in range(block):  # steady state: each forward waits for the previous step's gathers
                _step(wrapped, optimizer, x)
            elapsed = torch.tensor([stop() / block], device=device)
            if engine is not None:  # the last step's gathers end here, untimed, before the next variant's turn
                engine.wait_for_params()
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
            if index >= warmup:
                times[variant].append(float(elapsed))
    for _, _, engine in built.values():
        if engine is not None:
            engine.close()
    return times if rank == 0 else {"world": [float(world)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--block", type=int, default=3, help="steps timed together per turn, after one untimed step")
    parser.add_argument(
        "--caps", type=float, nargs="*", default=[14.0], help="extra bucket caps (MiB) for the prefetched engine"
    )
    args = parser.parse_args()
    backend = "nccl" if args.device == "cuda" and args.world == 1 else "gloo"  # one GPU: NCCL takes one rank
    times = run_world(
        rank_program,
        args.world,
        (args.layers, args.width, args.batch, args.rounds, args.warmup, args.device, tuple(args.caps), args.block),
        backend=backend,
        timeout_s=600,
    )[0]
    ddp = times["ddp"]
    where = f"{args.device}, {backend}"
    print(
        f"{args.layers} × Linear({args.width}), batch {args.batch}, W={args.world} ({where}), "
        f"{args.rounds} rounds of 1 + {args.block} steps per variant"
    )
    print(f"{'variant':<22} {'median step (ms)':>17} {'÷ DDP + Adam (median of rounds)':>33}")
    for variant in variants(args.caps):
        ratios = [t / d for t, d in zip(times[variant], ddp)]
        print(f"{variant:<22} {1e3 * statistics.median(times[variant]):>17.1f} {statistics.median(ratios):>33.3f}")


if __name__ == "__main__":
    main()
