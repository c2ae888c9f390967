"""Time to partition 10^5 parameters of realistic sizes, W = 8 … 4096.

Compares zero_lab's :class:`~zero_lab.partition.SortedGreedy` (a heap:
O(n log n + n log W)) with the straightforward greedy written here (scan all W loads
for the minimum: O(n·W)), both returning the same owners, and times :class:`Flat` too::

    python scripts/bench_partition.py                      # 10^5 parameters, W = 8 64 512 4096
    python scripts/bench_partition.py --params 20000 --world-sizes 8 4096

Sizes: transformer blocks of a width drawn from {768, 1024, 2048, 4096} — per block
layer-norm and bias vectors (d, 3d, 4d) and matrices (3d², d², 4d², 4d²), 12 tensors —
plus two embeddings (50257 × d). Only the sizes exist; no tensor is allocated.

Columns: ``assign`` = owners only (``SortedGreedy.assign`` vs the O(n·W) loop, best of
``--repeat``); ``partition`` = the full :class:`Partition` object a ZeRO optimizer
builds (shards validated, per-rank index), for SortedGreedy and Flat.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.partition import Flat, ParamSpec, SortedGreedy


def realistic_sizes(count: int, seed: int = 0) -> list[int]:
    """``count`` parameter sizes (numel) of transformer blocks of mixed widths, in model order."""
    rng = random.Random(seed)
    sizes: list[int] = []
    while len(sizes) < count - 2:
        d = rng.choice((768, 1024, 2048, 4096))
        sizes += [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    d = rng.choice((768, 1024, 2048, 4096))
    return [50_257 * d, *sizes[: count - 2], 50_257 * d]


def naive_greedy(sizes: Sequence[int], world_size: int) -> list[int]:
    """Largest first, each to the least-loaded rank (lowest on ties), scanning all W loads: O(n·W)."""
    loads = [0] * world_size
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):
        rank = loads.index(min(loads))
        owners[index] = rank
        loads[rank] += sizes[index]
    return owners


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Shortest wall time of ``repeat`` calls (the least disturbed one), and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_world_size(sizes: list[int], world_size: int, repeat: int, naive: bool) -> dict[str, Any]:
    """Timings (seconds) at one world size; checks the heap and the naive loop agree."""
    specs = [ParamSpec(numel=n) for n in sizes]
    groups = [0] * len(sizes)
    heap_s, heap_owners = best_time(lambda: SortedGreedy.assign(sizes, groups, world_size), repeat)
    row: dict[str, Any] = {"world_size": world_size, "assign_heap_s": heap_s}
    if naive:
        naive_s, naive_owners = best_time(lambda: naive_greedy(sizes, world_size), 1 if world_size > 512 else repeat)
        row |= {"assign_naive_s": naive_s, "speedup": naive_s / heap_s, "same_owners": naive_owners == heap_owners}
    row["partition_sorted_greedy_s"], partition = best_time(lambda: SortedGreedy()(specs, world_size), repeat)
    row["imbalance_sorted_greedy"] = partition.report().imbalance
    row["partition_flat_s"], flat = best_time(lambda: Flat()(specs, world_size), repeat)
    row["imbalance_flat"] = flat.report().imbalance
    return row


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| W | assign: heap (zero_lab) ms | assign: O(n·W) ms | speed-up | same owners "
        "| Partition: SortedGreedy ms | Partition: Flat ms | imbalance greedy / flat |"
    )
    lines = [head, "|---:|---:|---:|---:|:---:|---:|---:|---:|"]
    for r in rows:
        naive = ("–", "–", "–")
        if "assign_naive_s" in r:
            naive = (f"{1e3 * r['assign_naive_s']:.1f}", f"{r['speedup']:.1f}×", "yes" if r["same_owners"] else "NO")
        lines.append(
            f"| {r['world_size']} | {1e3 * r['assign_heap_s']:.1f} | {' | '.join(naive)} "
            f"| {1e3 * r['partition_sorted_greedy_s']:.1f} | {1e3 * r['partition_flat_s']:.1f} "
            f"| {r['imbalance_sorted_greedy']:.4f} / {r['imbalance_flat']:.4f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = script_parser(__doc__)
    parser.add_argument("--params", type=int, default=100_000, help="number of parameter tensors")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 64, 512, 4096])
    parser.add_argument("--repeat", type=int, default=3, help="calls per measurement; the best counts")
    parser.add_argument("--no-naive", action="store_true", help="skip the O(n·W) baseline")
    args = parser.parse_args(argv)
    sizes = realistic_sizes(args.params)
    print(f"$ {command_line('scripts/bench_partition.py', argv)}")
    print(f"{len(sizes):,} parameters, {sum(sizes):,} elements; best of {args.repeat}\n", flush=True)
    rows = [bench_world_size(sizes, w, args.repeat, not args.no_naive) for w in args.world_sizes]
    print(format_rows(rows))
    return rows


if __name__ == "__main__":
    main()
