"""``python scripts/calibrate.py``: this machine's Gloo fitted into a step-model hardware profile.

Times, through zero_lab's :class:`~zero_lab.comm.Communicator` (one thread per rank, a barrier
before each repetition, the slowest rank's time), ``all_reduce``, ``reduce_scatter``,
``all_gather``, ``broadcast`` and a point-to-point exchange (``send_recv``: every rank swaps a
buffer with its neighbour ``r ^ 1``) at several sizes and world sizes; then fits, per
collective, by least squares over every (W, size) point::

    t = α · steps(op, W) + busbytes(op, W, S) / B       (non-negative α and 1/B)

with the step counts and nccl-tests' bus-byte factors of :mod:`zero_lab.collective_cost`.
One thread's matmul rate (``(B × k) @ (k × k)``, forward and backward shapes) gives
``matmul_flops``; a ``torch.optim.Adam`` step on a large tensor gives ``memory_bandwidth``
(``ADAM_TOUCHES × 4`` bytes per element over its time); both in CPU time, so load from other
jobs does not lower them. Writes a profile YAML (atomically)
whose ``sources`` name the command, date and load average, and whose ``measured`` holds every
raw median::

    python scripts/calibrate.py --out zero_lab/bench/profiles/gloo_local.yaml
    python scripts/calibrate.py --world-sizes 2 --sizes-mib 0.25 4 --repeats 3 --out /tmp/quick.yaml
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import yaml

from zero_lab.bench.host import keep_freed_memory
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.collective_cost import Collective, Link, bus_bytes, latency_steps
from zero_lab.comm import Communicator
from zero_lab.files import write_atomic
from zero_lab.runtime.spawn import run_world
from zero_lab.step_model import ADAM_TOUCHES

__all__ = ["fit_link", "main", "measure_collectives", "measure_compute"]

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv")


def _slowest_median(run: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        dist.barrier()
        start = time.perf_counter()
        run()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's, as a step waits for it
        times.append(float(elapsed))
    return statistics.median(times[1:])


def _collectives(comm: Communicator, nbytes: int) -> dict[str, Callable[[], None]]:
    """One call of each op on buffers of about ``nbytes`` (S), on every rank; ``send_recv`` swaps with ``rank ^ 1``."""
    world, rank = comm.world_size, comm.rank
    n = max(world, nbytes // 4 // world * world)
    full, part, swap = torch.ones(n), torch.ones(n // world), torch.ones(n)
    peer = rank ^ 1
    ops: dict[str, Callable[[], None]] = {
        "all_reduce": lambda: comm.all_reduce(full),
        "reduce_scatter": lambda: comm.issue_reduce_scatter(part, full).wait(),
        "all_gather": lambda: comm.all_gather_into(full, part),
        "broadcast": lambda: comm.broadcast_many([(full, 0)]),
    }
    if peer < world:
        ops["send_recv"] = lambda: comm.issue_exchange([(full, peer)], [(swap, peer)]).wait()
    return ops


def measure_collectives(sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """On every rank of a world: the median seconds of each op at each size S (bytes, nccl-tests' S)."""
    torch.set_num_threads(1)
    keep_freed_memory()  # as the benchmark's timing phase runs
    comm = Communicator()
    rows = []
    for nbytes in sizes:
        for op, run in _collectives(comm, nbytes).items():
            size = 4 * max(comm.world_size, nbytes // 4 // comm.world_size * comm.world_size)
            rows.append(
                {"op": op, "world_size": comm.world_size, "nbytes": size, "seconds": _slowest_median(run, repeats)}
            )
    return rows


def measure_compute(repeats: int = 5) -> dict[str, float]:
    """One thread's matmul FLOP/s (forward and backward shapes) and an Adam step's bytes/s.

    Timed in this process's CPU time (``time.process_time``, one thread): the rate of an idle
    core even while other jobs share the machine, which wall time is not (a loaded 2-core host
    stretched it 3.5× here)."""
    torch.set_num_threads(1)
    keep_freed_memory()  # as the benchmark's timing phase runs: an Adam step's temporaries reuse the heap
    batch, width = 32, 1024
    x, w, dy = torch.randn(batch, width), torch.randn(width, width), torch.randn(batch, width)
    shapes = [lambda: x @ w, lambda: dy @ w.T, lambda: dy.T @ x]
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for matmul in shapes:
            matmul()
        times.append(time.process_time() - start)
    flops = 3 * 2 * batch * width * width / statistics.median(times)
    param = torch.zeros(4 << 20, requires_grad=True)
    param.grad = torch.ones_like(param)
    adam = torch.optim.Adam([param], lr=1e-3)
    adam.step()
    steps = []
    for _ in range(repeats):
        start = time.process_time()
        adam.step()
        steps.append(time.process_time() - start)
    bandwidth = ADAM_TOUCHES * param.numel() * 4 / statistics.median(steps)
    return {"matmul_flops": flops, "memory_bandwidth": bandwidth}


def fit_link(points: Sequence[tuple[Collective, float]]) -> Link:
    """Least-squares ``(α, 1/B)`` of ``t = α·steps + busbytes/B`` over ``(collective, seconds)`` points
    (ring steps); a negative α is clamped to 0 and ``B`` refitted alone."""
    rows = [(latency_steps(c.op, c.ranks), bus_bytes(c), t) for c, t in points]
    sxx = sum(a * a for a, _, _ in rows)
    sxy = sum(a * b for a, b, _ in rows)
    syy = sum(b * b for _, b, _ in rows)
    sxt = sum(a * t for a, _, t in rows)
    syt = sum(b * t for _, b, t in rows)
    det = sxx * syy - sxy * sxy
    alpha, inverse = ((syy * sxt - sxy * syt) / det, (sxx * syt - sxy * sxt) / det) if det else (0.0, 0.0)
    if alpha < 0 or inverse <= 0:
        alpha = 0.0 if alpha < 0 or not sxx else alpha
        inverse = max((syt - alpha * sxy) / syy, 1e-30) if syy else 1e-30
    return Link(alpha, 1 / inverse)


def profile_from(rows: list[dict[str, Any]], compute: dict[str, float], command: str, cores: int) -> dict[str, Any]:
    """The profile mapping (see :mod:`zero_lab.bench.hardware`) from measured rows and compute rates."""
    fits = {}
    for op in OPS:
        points = [(Collective(op, r["nbytes"], r["world_size"]), r["seconds"]) for r in rows if r["op"] == op]
        if points:
            link = fit_link(points)
            fits[op] = {"alpha_s": float(f"{link.alpha_s:.4g}"), "bus_bandwidth": float(f"{link.bus_bandwidth:.4g}")}
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    origin = f"`{command}` on {when}, load average {load:.1f} at the end (over {cores} cores: under load if > {cores})"
    one = fits.get("all_reduce", {"alpha_s": 1e-4, "bus_bandwidth": 1e9})
    return {
        "name": "gloo_local",
        "description": f"this host's Gloo, {cores} cores, one thread per rank (fitted by scripts/calibrate.py)",
        "ranks_per_node": 1024,
        "cores": cores,
        "overlap": 0.0,
        "algorithm": "ring",
        "matmul_flops": float(f"{compute['matmul_flops']:.4g}"),
        "memory_bandwidth": float(f"{compute['memory_bandwidth']:.4g}"),
        "links": {"intra": dict(one), "inter": dict(one)},  # one host: both classes are its all-reduce's
        "collectives": {op: dict(fit) for op, fit in fits.items()},
        "sources": {
            "collectives": f"least-squares alpha-beta fits of measured medians, {origin}",
            "matmul_flops": f"one thread's CPU time, (32 x 1024) @ (1024 x 1024) fwd and bwd shapes, {origin}",
            "memory_bandwidth": f"CPU time of an Adam step, 4 Mi elements x {ADAM_TOUCHES} touches x 4 B, {origin}",
            "overlap": "0: on a 2-core host the ranks' computation and Gloo's threads share the cores",
        },
        "measured": [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[0.25, 2.0, 16.0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per op and size (after one warm-up)")
    parser.add_argument("--out", required=True, help="the profile YAML to write (e.g. zero_lab/bench/profiles/...)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per world")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    sizes = [int(mib * 2**20) for mib in args.sizes_mib]
    rows = []
    for world in args.world_sizes:
        world_args = (sizes, args.repeats)
        limits = {"timeout_s": args.timeout, "deadline_s": args.timeout, "start_method": "forkserver"}
        ranks = run_world(measure_collectives, world, world_args, **limits)
        rows += ranks[0]  # every rank holds the same rows: each time is the slowest rank's
        print(f"W={world}: measured {len(sizes)} sizes of {len(OPS)} collectives", flush=True)
    command = command_line("scripts/calibrate.py", argv)
    profile = profile_from(rows, measure_compute(args.repeats), command, os.cpu_count() or 1)
    text = yaml.safe_dump(profile, sort_keys=False, width=110)
    write_atomic(args.out, lambda f: f.write(text.encode("utf-8")))
    for op, fit in profile["collectives"].items():
        print(f"  {op:<15} alpha {fit['alpha_s'] * 1e6:9.1f} us   busbw {fit['bus_bandwidth'] / 1e9:7.3f} GB/s")
    print(f"  matmul {profile['matmul_flops'] / 1e9:.1f} GFLOP/s, Adam {profile['memory_bandwidth'] / 1e9:.2f} GB/s")
    print(f"profile: {args.out}")
    return profile
