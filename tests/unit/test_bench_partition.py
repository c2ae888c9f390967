"""zero_lab.bench.partition_speed: the O(n·W) baseline assigns exactly as zero_lab's heap does."""

from __future__ import annotations

import random

from zero_lab.bench import partition_speed as bench_partition
from zero_lab.partition import SortedGreedy


def test_naive_greedy_equals_the_heap_including_ties() -> None:
    rng = random.Random(1)
    sizes = [rng.choice((1, 7, 7, 64, 1000, 4096)) for _ in range(500)]
    for world_size in (1, 3, 8, 100):
        assert bench_partition.naive_greedy(sizes, world_size) == SortedGreedy.assign(sizes, [0] * 500, world_size)


def test_realistic_sizes_have_the_requested_count_and_embeddings_at_both_ends() -> None:
    sizes = bench_partition.realistic_sizes(1000)
    assert len(sizes) == 1000 and sizes[0] % 50_257 == 0 and sizes[-1] % 50_257 == 0
    assert bench_partition.realistic_sizes(1000) == sizes  # seeded


def test_small_run_prints_a_table(capsys) -> None:
    rows = bench_partition.main(["--params", "2000", "--world-sizes", "8", "64", "--repeat", "1"])
    assert [r["world_size"] for r in rows] == [8, 64] and all(r["same_owners"] for r in rows)
    assert "| 64 |" in capsys.readouterr().out
