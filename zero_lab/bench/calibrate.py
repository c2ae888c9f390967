"""``python scripts/calibrate.py``: this machine's Gloo fitted into a step-model hardware profile.

Times, through zero_lab's :class:`~zero_lab.comm.Communicator` (one thread per rank, a barrier
before each repetition, the slowest rank's time), ``all_reduce``, ``reduce_scatter``,
``all_gather``, ``broadcast``, a point-to-point exchange (``send_recv``: every rank swaps a
buffer with its neighbour ``r ^ 1``; and ``send_one_way``, the same pairs one way only, which
says whether a rank's sends and receives run at once: ``duplex``, :func:`duplex_from`) and
zero_lab's point-to-point reduce-scatter as DDP's hook issues it (``p2p_reduce_scatter``:
``grad_reduce=reduce_scatter``'s strategy on W equal segments of a bucket of the size, its
receive buffers and adds included) at several sizes (default 0.25 to 64 MiB: the check's
largest exchange is the tutorial's 61 MiB buffer) and world sizes; then fits, per collective,
by least squares on the relative error over every (W, size) point (:func:`fit_link`)::

    t = α · steps(op, W) + busbytes(op, W, S) / B       (non-negative α and 1/B)

with the step counts and nccl-tests' bus-byte factors of :mod:`zero_lab.collective_cost`; each
measured row keeps its ``fit_error`` against the fit the step model uses for its world, and
``sources.fit_errors`` names each op's largest (:func:`with_fit_errors`).
**Crowded worlds** (more ranks than the host's cores, e.g. W = 4 on 2): each op is also fitted on
that world's points alone, and every rank of it times the matmul and the Adam step below at once
(:func:`crowded_rates`: CPU time, the slowest rank's median block, times ``cores / W`` for the
rank's turns on the cores) — the world's per-rank rates. They go to the profile's ``crowded``
section, which the step model prices such a world with
(:meth:`~zero_lab.collective_cost.Hardware.on_host`).
One thread's matmul rate (``(B × k) @ (k × k)``, forward and backward shapes) gives
``matmul_flops``; ``torch.optim.Adam`` steps on the parameters of the benchmark's models (their
shapes, :data:`ADAM_MODELS`) give ``memory_bandwidth`` (``ADAM_TOUCHES × 4`` bytes per element
over their time); both in CPU time, so waiting for other jobs does not lower them, and each the
fastest of ``--blocks`` timed blocks (:class:`Rate`; the spread printed and kept in ``sources``),
since other jobs still slow a block through the caches and memory bus they share. Writes a profile YAML (atomically)
whose ``sources`` name the command, date and load average, and whose ``measured`` holds every
raw median::

    python scripts/calibrate.py --out zero_lab/bench/profiles/gloo_local.yaml
    python scripts/calibrate.py --world-sizes 2 --sizes-mib 0.25 4 --repeats 3 --out /tmp/quick.yaml
    python scripts/calibrate.py --refit old.yaml --out new.yaml    # run nothing: refit old.yaml's measured rows
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import yaml

from zero_lab.bench.hardware import hardware_from_dict
from zero_lab.bench.host import keep_freed_memory
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.bench.workloads import MODELS
from zero_lab.collective_cost import Collective, Link, bus_bytes, latency_steps, seconds
from zero_lab.comm import Communicator
from zero_lab.files import write_atomic
from zero_lab.grad_reduce import grad_reduce_named
from zero_lab.runtime.spawn import run_world
from zero_lab.step_model import ADAM_TOUCHES

__all__ = [
    "ADAM_MODELS",
    "Rate",
    "adam_rate",
    "crowded_rates",
    "duplex_from",
    "fit_error",
    "fit_link",
    "fitted_sections",
    "main",
    "matmul_rate",
    "measure_collectives",
    "measure_compute",
    "refit",
    "slowest_median",
    "with_fit_errors",
]

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "p2p_reduce_scatter")
#: ``send_recv``'s pairs sending one way only (even ranks send, odd ones receive): with the swap, says ``duplex``.
ONE_WAY = "send_one_way"
#: A one-way message slower than this share of a swap of the same size: the link is duplex.
DUPLEX_SHARE = 0.75
#: Messages (nccl-tests' S) from this size on are fitted apart: Gloo's all-gather here moves
#: ~1.1 GB/s of bus bytes up to 16 MiB and ~0.5 GB/s at 32 and 64 MiB (calibrations of
#: 2026-11-28, W=2), while the check's 27 MiB all-gather (linear768) still runs at the small rate.
LARGE_FROM = 32 * 2**20


def slowest_median(run: Callable[[], None], repeats: int, warmups: int = 1) -> float:
    """The median over ``repeats`` calls of ``run`` (after ``warmups`` untimed ones), each started
    after a barrier and timed as the slowest rank's (as a step waits for it); the same on every rank."""
    times = []
    for _ in range(repeats + warmups):
        dist.barrier()
        start = time.perf_counter()
        run()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's, as a step waits for it
        times.append(float(elapsed))
    return statistics.median(times[warmups:])


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
        one_way = ([(full, peer)], []) if rank % 2 == 0 else ([], [(swap, peer)])
        ops[ONE_WAY] = lambda: comm.issue_exchange(*one_way).wait()
    # as DDP's comm hook issues grad_reduce=reduce_scatter: W equal segments of the bucket, the adds included
    segments = list(torch.zeros(n).chunk(world))
    p2p = grad_reduce_named("reduce_scatter")
    ops["p2p_reduce_scatter"] = lambda: p2p.issue(comm, segments, tag=0).wait()
    return ops


def measure_collectives(
    sizes: Sequence[int],
    repeats: int,
    blocks: int = 0,
    cores: int | None = None,
    models: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """On every rank of a world: the median seconds of each op at each size S (bytes, nccl-tests' S);
    then, if ``blocks`` and the world has more ranks than the host's ``cores`` (default: this
    host's), its per-rank compute rates (:func:`crowded_rates`, Adam on ``models``' parameters,
    default :data:`ADAM_MODELS`) as rows ``{"op": "matmul_flops" | "memory_bandwidth",
    "world_size", "rate"}``."""
    torch.set_num_threads(1)
    keep_freed_memory()  # as the benchmark's timing phase runs
    comm = Communicator()
    rows = []
    for nbytes in sizes:
        for op, run in _collectives(comm, nbytes).items():
            size = 4 * max(comm.world_size, nbytes // 4 // comm.world_size * comm.world_size)
            rows.append(
                {"op": op, "world_size": comm.world_size, "nbytes": size, "seconds": slowest_median(run, repeats)}
            )
    cores = cores or os.cpu_count() or 1
    if blocks and comm.world_size > cores:
        rates = crowded_rates(blocks, cores, tuple(models) or ADAM_MODELS)
        rows += [{"op": k, "world_size": comm.world_size, "rate": v} for k, v in rates.items()]
    return rows


def crowded_rates(blocks: int, cores: int, models: Sequence[str]) -> dict[str, float]:
    """One rank's matmul FLOP/s and Adam bytes/s in a world of more ranks than cores, every rank
    computing at once: each rank's CPU-time rate over ``blocks`` blocks (what the ranks' contention
    for the caches and the memory bus leaves it; other jobs' turns on the cores are not counted, as
    for the rates alone), the slowest rank's median block (a step waits for the slowest), times
    ``cores / W``: the rank's turns on the cores. Adam steps the parameters of ``models``."""
    world = dist.get_world_size()
    out = {}
    timers = (("matmul_flops", lambda: matmul_rate(blocks)), ("memory_bandwidth", lambda: adam_rate(models, blocks)))
    for key, rate in timers:
        dist.barrier()  # every rank starts at once
        median = torch.tensor([rate().spread[1]], dtype=torch.float64)
        dist.all_reduce(median, op=dist.ReduceOp.MIN)
        out[key] = float(median) * cores / world
    return out


#: The benchmark models whose parameters the Adam step is timed on (the model check's two).
ADAM_MODELS = ("tutorial-quick", "linear768")


@dataclass(frozen=True)
class Rate:
    """A rate timed in ``blocks``: the work of one block over its CPU seconds, for each block.

    ``value`` is the fastest block's (the least disturbed by other jobs: CPU time leaves out the
    waits, not the caches and the memory bus they share), ``spread`` its min / median / max."""

    work: float
    seconds: tuple[float, ...]

    @property
    def value(self) -> float:
        return self.work / min(self.seconds)

    @property
    def spread(self) -> tuple[float, float, float]:
        rates = sorted(self.work / t for t in self.seconds)
        return rates[0], statistics.median(rates), rates[-1]

    def describe(self, unit: float, name: str) -> str:
        low, middle, high = (r / unit for r in self.spread)
        return f"{high:.3g} {name} (blocks: min {low:.3g}, median {middle:.3g}, max {high:.3g})"


def _blocks(run: Callable[[], None], blocks: int, per_block: int) -> tuple[float, ...]:
    """CPU seconds (``time.process_time``) of ``blocks`` blocks of ``per_block`` calls, after one warm-up call."""
    run()
    times = []
    for _ in range(blocks):
        start = time.process_time()
        for _ in range(per_block):
            run()
        times.append(time.process_time() - start)
    return tuple(times)


def adam_rate(models: Sequence[str] = ADAM_MODELS, blocks: int = 7, per_block: int = 3) -> Rate:
    """An Adam step's bytes per CPU second on the parameters of the benchmark ``models`` (their
    shapes: per-tensor overheads included, as a benchmark step pays them): ``ADAM_TOUCHES × 4``
    bytes per element of every model's parameters over the summed time of one step of each, per block."""
    steppers, elements = [], 0
    for name in models:
        params = [p for p in MODELS[name].build().parameters() if p.requires_grad]
        for param in params:
            param.grad = torch.ones_like(param)
        steppers.append(torch.optim.Adam(params, lr=1e-3).step)
        elements += sum(p.numel() for p in params)

    def step_each() -> None:
        for step in steppers:
            step()

    return Rate(ADAM_TOUCHES * 4 * elements * per_block, _blocks(step_each, blocks, per_block))


def matmul_rate(blocks: int = 7, per_block: int = 5, batch: int = 32, width: int = 1024) -> Rate:
    """FLOP per CPU second of ``(batch × width) @ (width × width)`` in its forward and two backward shapes."""
    x, w, dy = torch.randn(batch, width), torch.randn(width, width), torch.randn(batch, width)

    def shapes() -> None:
        x @ w, dy @ w.T, dy.T @ x

    return Rate(3 * 2 * batch * width * width * per_block, _blocks(shapes, blocks, per_block))


def measure_compute(blocks: int = 7, models: Sequence[str] = ADAM_MODELS) -> dict[str, Rate]:
    """One thread's matmul FLOP/s and an Adam step's bytes/s, each the fastest of ``blocks`` timed blocks.

    Timed in this process's CPU time (``time.process_time``, one thread): the rate of an idle
    core even while other jobs share the machine, which wall time is not (a loaded 2-core host
    stretched it 3.5× here); the fastest block, as other jobs still slow a block through the caches
    and the memory bus they share (three single-block refits within minutes read 8.9, 17.3 and
    17.4 GB/s). Freed memory stays in the heap (as the benchmark's timing phases run)."""
    torch.set_num_threads(1)
    keep_freed_memory()
    return {"matmul_flops": matmul_rate(blocks), "memory_bandwidth": adam_rate(models, blocks)}


def fit_link(points: Sequence[tuple[Collective, float]], alpha_s: float | None = None) -> Link:
    """``(α, 1/B)`` of ``t = α·steps + busbytes/B`` over ``(collective, seconds)`` points (ring steps),
    by least squares on the *relative* error ``(fit - t) / t`` (each point weighted ``1/t²``): a
    0.25 MiB point's 0.3 ms weighs as much as a 64 MiB point's 50 ms, so one fit holds across
    sizes that differ 256-fold instead of the largest points setting it alone. A negative α is
    clamped to 0 and ``B`` refitted alone; with ``alpha_s`` given, only ``B`` is fitted."""
    rows = [(latency_steps(c.op, c.ranks), bus_bytes(c), t, 1 / t**2) for c, t in points]
    sxx = sum(w * a * a for a, _, _, w in rows)
    sxy = sum(w * a * b for a, b, _, w in rows)
    syy = sum(w * b * b for _, b, _, w in rows)
    sxt = sum(w * a * t for a, _, t, w in rows)
    syt = sum(w * b * t for _, b, t, w in rows)
    det = sxx * syy - sxy * sxy
    alpha, inverse = ((syy * sxt - sxy * syt) / det, (sxx * syt - sxy * sxt) / det) if det else (0.0, 0.0)
    if alpha_s is not None:  # only B, at the given α
        return Link(alpha_s, 1 / max((syt - alpha_s * sxy) / syy, 1e-30) if syy else 1e30)
    if alpha < 0 or inverse <= 0:
        alpha = 0.0 if alpha < 0 or not sxx else alpha
        inverse = max((syt - alpha * sxy) / syy, 1e-30) if syy else 1e-30
    return Link(alpha, 1 / inverse)


def fit_error(link: Link, collective: Collective, measured: float) -> float:
    """The fit's relative error at one measured point: ``(α·steps + busbytes/B - t) / t``."""
    fitted = link.alpha_s * latency_steps(collective.op, collective.ranks) + bus_bytes(collective) / link.bus_bandwidth
    return (fitted - measured) / measured


def duplex_from(rows: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """Whether a rank's sends and receives run at once: the median over (W, size ≥ 1 MiB) of a
    one-way message's time over a swap's. Near 1: each way has its own rate (duplex); near 1/2:
    one rate shared by both ways. ``(True, why)`` without one-way rows (a NIC's default)."""
    swaps = {(r["world_size"], r["nbytes"]): r["seconds"] for r in rows if r["op"] == "send_recv"}
    shares = [
        r["seconds"] / swaps[(r["world_size"], r["nbytes"])]
        for r in rows
        if r["op"] == ONE_WAY and r["nbytes"] >= 2**20 and swaps.get((r["world_size"], r["nbytes"]))
    ]
    if not shares:
        return True, "no one-way messages measured: duplex assumed"
    share = statistics.median(shares)
    duplex = share > DUPLEX_SHARE
    return (
        duplex,
        f"a one-way message takes {share:.2f} x a swap's time (median of {len(shares)}; > {DUPLEX_SHARE}: duplex)",
    )


def _points(rows: Sequence[dict[str, Any]], op: str) -> list[tuple[Collective, float]]:
    return [(Collective(op, r["nbytes"], r["world_size"]), r["seconds"]) for r in rows if r["op"] == op]


def _yaml_link(link: Link) -> dict[str, float]:
    return {"alpha_s": float(f"{link.alpha_s:.4g}"), "bus_bandwidth": float(f"{link.bus_bandwidth:.4g}")}


def _fits(rows: Sequence[dict[str, Any]], large_from: int | None) -> dict[str, dict[str, dict[str, float]]]:
    """Per op, the α-β fit of its rows (profile YAML form, 4 significant digits): ``collectives``
    on the messages smaller than ``large_from`` bytes, ``large_collectives`` on the others: their
    own bandwidth at the small messages' α (two sizes of a bandwidth-bound range leave α
    ill-determined; every size in ``collectives`` when all are on one side, or ``large_from`` is ``None``)."""
    small, large = {}, {}
    for op in OPS:
        points = _points(rows, op)
        below = [p for p in points if large_from is None or p[0].nbytes < large_from]
        above = [p for p in points if p not in below]
        if below and above:  # the same per-step latency; the large messages' own bandwidth
            fit = fit_link(below)
            small[op], large[op] = _yaml_link(fit), _yaml_link(fit_link(above, alpha_s=fit.alpha_s))
        elif points:
            small[op] = _yaml_link(fit_link(points))
    return {"collectives": small, "large_collectives": large} if large else {"collectives": small}


def fitted_sections(rows: Sequence[dict[str, Any]], cores: int, large_from: int | None) -> dict[str, Any]:
    """The profile's fitted sections from its measured ``rows``: ``collectives`` (and
    ``large_from_bytes``, ``large_collectives`` where a size reaches ``large_from``) on every
    world's rows, and ``crowded``: each world of more ranks than ``cores`` fitted on its rows
    alone, with its per-rank compute rates where measured."""
    out: dict[str, Any] = _fits(rows, large_from)
    crowded: dict[int, dict[str, Any]] = {}
    for world in sorted({r["world_size"] for r in rows if r["world_size"] > cores}):
        mine = [r for r in rows if r["world_size"] == world]
        crowded[world] = _fits(mine, large_from) | {r["op"]: float(f"{r['rate']:.4g}") for r in mine if "rate" in r}
    if any("large_collectives" in section for section in [out, *crowded.values()]):
        out = {"collectives": out["collectives"], "large_from_bytes": large_from, **out}
    return {**out, "crowded": crowded}


def with_fit_errors(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` with each measured time's relative error (3 digits) against the time the step
    model prices it at (:func:`~zero_lab.collective_cost.seconds` on the profile as one of that
    world's ranks sees it: its world's fits, crowded or not, and its size's), and
    ``sources.fit_errors``: per op, its largest error and where."""
    hardware = hardware_from_dict(profile)
    rows, worst = [], {}
    for row in profile.get("measured") or []:
        row = {k: v for k, v in row.items() if k != "fit_error"}
        if "seconds" in row and row["op"] in hardware.collectives:
            collective = Collective(row["op"], row["nbytes"], row["world_size"])
            priced = seconds(hardware.on_host(row["world_size"]), collective)  # as the step model prices it
            row["fit_error"] = round((priced - row["seconds"]) / row["seconds"], 3)
            if abs(row["fit_error"]) > abs(worst.get(row["op"], (0.0, ""))[0]):
                worst[row["op"]] = (row["fit_error"], f"W={row['world_size']}, {row['nbytes'] / 2**20:g} MiB")
        rows.append(row)
    summary = "; ".join(f"{op} {e * 100:+.0f} % ({where})" for op, (e, where) in worst.items())
    sources = dict(profile.get("sources") or {})
    if summary:
        sources["fit_errors"] = f"largest relative error of each op's fit over its measured points: {summary}"
    return dict(profile, sources=sources, measured=rows)


def refit(profile: dict[str, Any], cores: int | None = None, large_from: int | None = LARGE_FROM) -> dict[str, Any]:
    """``profile`` with its fitted sections (:func:`fitted_sections`) fitted again from its
    ``measured`` rows (the compute rates kept), messages from ``large_from`` bytes on apart
    (``None``: one fit over every size): what a change to the fitting does to a stored
    calibration, run nothing."""
    rows = profile.get("measured") or []
    if not rows:
        raise ValueError("--refit: the profile has no measured rows to fit; run scripts/calibrate.py to measure them")
    cores = cores or profile.get("cores") or 1
    kept = {k: v for k, v in profile.items() if k not in ("large_from_bytes", "large_collectives")}
    out = kept | fitted_sections(rows, cores, large_from)
    return _ordered(with_fit_errors(out))


def _ordered(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's keys in the YAML's reading order (``crowded`` after ``collectives``, ``measured`` last)."""
    after = ("large_from_bytes", "large_collectives", "crowded")
    first = [k for k in profile if k not in (*after, "sources", "measured")]
    at = first.index("collectives") + 1 if "collectives" in first else len(first)
    keys = [*first[:at], *after, *first[at:], "sources", "measured"]
    return {k: profile[k] for k in keys if k in profile}


def profile_from(
    rows: list[dict[str, Any]],
    compute: dict[str, Rate],
    command: str,
    cores: int,
    compute_blocks: int = 7,
    large_from: int | None = LARGE_FROM,
) -> dict[str, Any]:
    """The profile mapping (see :mod:`zero_lab.bench.hardware`) from measured rows and compute rates;
    messages of ``large_from`` bytes and more fitted apart (:func:`fitted_sections`)."""
    sections = fitted_sections(rows, cores, large_from)
    fits = sections["collectives"]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    origin = f"`{command}` on {when}, load average {load:.1f} at the end (over {cores} cores: under load if > {cores})"
    one = fits.get("all_reduce", {"alpha_s": 1e-4, "bus_bandwidth": 1e9})
    duplex, why = duplex_from(rows)
    matmul, adam = compute["matmul_flops"], compute["memory_bandwidth"]
    profile = {
        "name": "gloo_local",
        "description": f"this host's Gloo, {cores} cores, one thread per rank (fitted by scripts/calibrate.py)",
        "ranks_per_node": 1024,
        "cores": cores,
        "overlap": 0.0,
        "duplex": duplex,
        "algorithm": "ring",
        "matmul_flops": float(f"{matmul.value:.4g}"),
        "memory_bandwidth": float(f"{adam.value:.4g}"),
        "links": {"intra": dict(one), "inter": dict(one)},  # one host: both classes are its all-reduce's
        **sections,
        "sources": {
            "collectives": (
                "alpha-beta fits of measured medians, least squares on the relative error, over every world; "
                f"messages from large_from_bytes on fitted apart (large_collectives), {origin}"
            ),
            "duplex": f"{why}, {origin}",
            "matmul_flops": (
                f"one thread's CPU time, (32 x 1024) @ (1024 x 1024) fwd and bwd shapes, fastest of "
                f"{len(matmul.seconds)} blocks: {matmul.describe(1e9, 'GFLOP/s')}, {origin}"
            ),
            "memory_bandwidth": (
                f"CPU time of torch.optim.Adam steps on the parameters of {', '.join(ADAM_MODELS)}, "
                f"{ADAM_TOUCHES} touches x 4 B per element, fastest of {len(adam.seconds)} blocks: "
                f"{adam.describe(1e9, 'GB/s')}, {origin}"
            ),
            "overlap": "0: on a 2-core host the ranks' computation and Gloo's threads share the cores",
            "crowded": (
                f"worlds of more ranks than the {cores} cores: each op fitted on that world's medians alone; "
                "matmul and Adam rates per rank: CPU time with every rank computing at once (the slowest "
                f"rank's median of {compute_blocks} blocks) x cores / W, {origin}"
            ),
        },
        "measured": [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows],
    }
    return _ordered(with_fit_errors(profile))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[0.25, 2.0, 16.0, 32.0, 64.0])
    parser.add_argument(
        "--large-from-mib",
        type=float,
        default=LARGE_FROM / 2**20,
        help="messages from this size on are fitted apart (large_collectives); 0: one fit over every size",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per op and size (after one warm-up)")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks of the matmul and the Adam step")
    parser.add_argument("--out", required=True, help="the profile YAML to write (e.g. zero_lab/bench/profiles/...)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per world")
    parser.add_argument(
        "--refit", metavar="PROFILE", help="run nothing: fit a stored profile's measured rows again, write it to --out"
    )
    return parser.parse_args(argv)


_RATES = (("matmul_flops", "GFLOP/s"), ("memory_bandwidth", "GB/s"))


def _write(profile: dict[str, Any], out: str) -> None:
    text = yaml.safe_dump(profile, sort_keys=False, width=110)
    write_atomic(out, lambda f: f.write(text.encode("utf-8")))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    large_from = int(args.large_from_mib * 2**20) or None
    if args.refit:
        with open(args.refit) as f:
            profile = refit(yaml.safe_load(f), large_from=large_from)
        _write(profile, args.out)
        print(f"profile: {args.out} (refitted from the measured rows of {args.refit})")
        return profile
    sizes = [int(mib * 2**20) for mib in args.sizes_mib]
    rows = []
    for world in args.world_sizes:
        world_args = (sizes, args.repeats, args.blocks, os.cpu_count() or 1)
        limits = {"timeout_s": args.timeout, "deadline_s": args.timeout, "start_method": "forkserver"}
        ranks = run_world(measure_collectives, world, world_args, **limits)
        rows += ranks[0]  # every rank holds the same rows: each time is the slowest rank's
        print(f"W={world}: measured {len(sizes)} sizes of {len(OPS)} collectives", flush=True)
    command = command_line("scripts/calibrate.py", argv)
    compute = measure_compute(args.blocks)
    profile = profile_from(rows, compute, command, os.cpu_count() or 1, args.blocks, large_from)
    _write(profile, args.out)
    large = profile.get("large_collectives") or {}
    for op, fit in profile["collectives"].items():
        line = f"  {op:<18} alpha {fit['alpha_s'] * 1e6:7.1f} us  busbw {fit['bus_bandwidth'] / 1e9:6.3f} GB/s"
        if op in large:
            line += f"  (>= {args.large_from_mib:g} MiB: {large[op]['alpha_s'] * 1e6:.1f} us, "
            line += f"{large[op]['bus_bandwidth'] / 1e9:.3f} GB/s)"
        print(line)
    print(f"  {profile['sources'].get('fit_errors', '')}")
    print(f"  matmul {compute['matmul_flops'].describe(1e9, 'GFLOP/s')}")
    print(f"  Adam   {compute['memory_bandwidth'].describe(1e9, 'GB/s')}")
    print(f"  duplex {profile['duplex']}: {profile['sources']['duplex'].split(', `')[0]}")
    for world, section in profile["crowded"].items():
        rates = [f"{section[k] / 1e9:.3g} {unit}" for k, unit in _RATES if k in section]
        print(f"  crowded W={world}: {', '.join(rates) or 'collectives only'} per rank")
    print(f"profile: {args.out}")
    return profile
