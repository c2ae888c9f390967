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

The ``engine*`` variants run the engine's defaults: on CPU at W ≥ 2 on this one x86-64 host, its
collectives go through host shared memory (:mod:`zero_lab.host_shm`: ``shm_reduce_scatter`` +
``shm_all_gather``). There two more variants show where the gain comes from: ``engine_gloo`` /
``engine_gloo_prefetch`` name the point-to-point modes over Gloo (``reduce_scatter`` +
``p2p_all_gather``), and ``ddp_shm`` is the control, DDP + Adam with its all-reduce as a comm hook
through the same shared memory (``shm_all_reduce``): the gap between ``ddp`` and ``ddp_shm`` is the
transport's, between ``ddp_shm`` and ``engine*`` the sharding's. ``--no-shm`` leaves them out.

    python scripts/bench_engine_speed.py                          # 12 × Linear(768), batch 16, 30 rounds
    python scripts/bench_engine_speed.py --caps 8 14 28           # the prefetched engine at three more caps
    python scripts/bench_engine_speed.py --layers 20 --width 2000 --batch 20 --rounds 8 --caps --only engine engine_gloo
    python scripts/bench_engine_speed.py --device cuda --world 1   # NCCL on one GPU (W=2: Gloo, one GPU)

On CUDA each step is timed with CUDA events on the current stream (the host returns before the
kernels and the NCCL collectives finish).
"""

from __future__ import annotations

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

from zero_lab import ShardedDataParallel
from zero_lab.bench.host import keep_freed_memory
from zero_lab.bench.script_args import script_parser
from zero_lab.runtime.spawn import run_world

BASE_VARIANTS = ("ddp", "ddp_aa", "engine", "engine_prefetch", "engine_sorted_greedy")
#: where the engine's defaults go through host shared memory (zero_lab.host_shm): the engine over Gloo
#: (its point-to-point modes, named) and DDP + Adam with its all-reduce as a comm hook through shared
#: memory (the control: the transport's share of the gain)
SHM_VARIANTS = ("engine_gloo", "engine_gloo_prefetch", "ddp_shm")
GLOO = {"grad_reduce": "reduce_scatter", "exchange": "p2p_all_gather"}


def variants(caps: list[float], shm: bool = True, only: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The base variants, the prefetched engine once per extra bucket cap (``engine_prefetch_cap14``), then
    (``shm``: the engine's defaults go through shared memory) the Gloo ones and the control; with ``only``,
    those of them and the reference and its A/A control (``ddp``, ``ddp_aa``), which every ratio needs."""
    names = BASE_VARIANTS + tuple(f"engine_prefetch_cap{cap:g}" for cap in caps)
    if shm:
        names += SHM_VARIANTS
    if only:
        names = tuple(name for name in names if name in ("ddp", "ddp_aa") or name in only)
    return names


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _build(variant: str, layers: int, width: int, device: str) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    from zero_lab import SortedGreedy, reduce_gradients

    model = _model(layers, width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    if variant.startswith("ddp"):
        ddp = DDP(model, device_ids=[0] if device == "cuda" else None)
        hook = reduce_gradients(ddp, optimizer, "shm_all_reduce") if variant == "ddp_shm" else None
        return ddp, optimizer, hook
    partitioner = SortedGreedy() if variant.endswith("sorted_greedy") else None
    options: dict[str, Any] = {"bucket_cap_mb": float(variant.rpartition("_cap")[2])} if "_cap" in variant else {}
    options.update(GLOO if "_gloo" in variant else {})
    engine = ShardedDataParallel(model, optimizer, prefetch="prefetch" in variant, partitioner=partitioner, **options)
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
    shm: bool = True,
    only: tuple[str, ...] = (),
) -> dict[str, list[float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    names = variants(list(caps), shm, only)
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
            if isinstance(engine, ShardedDataParallel):  # the last step's gathers end here, untimed
                engine.wait_for_params()
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
            if index >= warmup:
                times[variant].append(float(elapsed))
    for _, _, engine in built.values():
        if engine is not None:
            engine.close()  # the engine, or the control's comm hook (its mailboxes)
    return times if rank == 0 else {"world": [float(world)]}


def main() -> None:
    parser = script_parser(__doc__)
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
    parser.add_argument(
        "--no-shm", dest="shm", action="store_false", help="leave out engine_gloo* and the ddp_shm control"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="VARIANT",
        help="run only these variants, beside ddp and ddp_aa (each variant holds its own model and optimizer: "
        "the tutorial's model with every variant needs more memory than 24 GiB)",
    )
    args = parser.parse_args()
    unknown = sorted(set(args.only) - set(variants(args.caps, True)))
    if unknown:
        parser.error(f"--only: unknown variant(s) {', '.join(unknown)}; known: {', '.join(variants(args.caps, True))}")
    backend = "nccl" if args.device == "cuda" and args.world == 1 else "gloo"  # one GPU: NCCL takes one rank
    shm = args.shm and args.device == "cpu" and args.world > 1  # shared memory moves host memory between ranks
    times = run_world(
        rank_program,
        args.world,
        (
            args.layers,
            args.width,
            args.batch,
            args.rounds,
            args.warmup,
            args.device,
            tuple(args.caps),
            args.block,
            shm,
            tuple(args.only),
        ),
        backend=backend,
        timeout_s=600,
    )[0]
    ddp = times["ddp"]
    where = f"{args.device}, {backend}"
    print(
        f"{args.layers} × Linear({args.width}), batch {args.batch}, W={args.world} ({where}), "
        f"{args.rounds} rounds of 1 + {args.block} steps per variant"
    )
    print(f"{'variant':<26} {'median step (ms)':>17} {'÷ DDP + Adam (median of rounds)':>33}")
    for variant in variants(args.caps, shm, tuple(args.only)):
        ratios = [t / d for t, d in zip(times[variant], ddp)]
        print(f"{variant:<26} {1e3 * statistics.median(times[variant]):>17.1f} {statistics.median(ratios):>33.3f}")


if __name__ == "__main__":
    main()
