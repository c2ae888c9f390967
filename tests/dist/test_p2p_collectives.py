"""The point-to-point paths on Gloo, at W=2 and 3: the all-gather ``exchange="p2p_all_gather"``
fills unequal (and empty) ranges in place, metered as one all-gather; the reduce-scatter sums
in place into this rank's segment, bitwise the rank-order sum, and the bucket keeps it there
(no copy back) with zeros elsewhere."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from zero_lab.collectives import P2PAllGather
from zero_lab.comm import Communicator
from zero_lab.grad_reduce import BucketRoute, P2PReduceScatter


def _bounds(world_size: int) -> list[tuple[int, int]]:
    """Unequal ranges, rank 1's empty: 5, 0, 7, 3, ... elements."""
    sizes = [5, 0, 7, 3][:world_size]
    out, start = [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


def p2p_all_gather() -> dict[str, Any]:
    comm = Communicator()
    bounds = _bounds(comm.world_size)
    expected = torch.arange(float(bounds[-1][1])) * 1.5
    storage = torch.full_like(expected, -1.0)
    start, stop = bounds[comm.rank]
    storage[start:stop] = expected[start:stop]
    before = storage.data_ptr()
    collective = P2PAllGather()
    collective.issue(comm, storage, bounds, collective.label).wait()
    return {
        "equal": torch.equal(storage, expected),
        "in_place": storage.data_ptr() == before,
        "bytes": comm.stats.bytes,
        "nbytes": collective.nbytes(bounds, storage.element_size()),
        "sent": comm.stats.sent_bytes,
        "own_bytes": (stop - start) * storage.element_size(),
        "calls": comm.stats.calls,
    }


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_p2p_all_gather_fills_unequal_ranges_in_place(world, world_size):
    for row in world(p2p_all_gather, world_size):
        assert row["equal"] and row["in_place"]
        assert row["bytes"] == row["nbytes"] == sum(b - a for a, b in _bounds(world_size)) * 4
        assert row["sent"] == row["own_bytes"] * (world_size - 1)  # its range once per peer, nothing else
        assert row["calls"] == 1


def p2p_reduce_scatter() -> dict[str, Any]:
    comm = Communicator()
    world_size, rank = comm.world_size, comm.rank
    route = BucketRoute(tuple(((r * 6, r * 6 + 6),) for r in range(world_size)), 6 * world_size)
    # magnitudes far apart, so the order of the sum shows in the last bits
    contributions = [
        torch.randn(6 * world_size, generator=torch.Generator().manual_seed(r)) * 10.0 ** (3 * r - 3)
        for r in range(world_size)
    ]
    flat = contributions[rank].clone()
    segments = route.segments(flat)
    mine = segments[rank]
    reduced = P2PReduceScatter().issue(comm, segments, tag=7).wait()
    route.scatter_back(flat, rank, reduced)
    expected = contributions[0][rank * 6 : rank * 6 + 6].clone()
    for r in range(1, world_size):
        expected += contributions[r][rank * 6 : rank * 6 + 6]  # ((s_0 + s_1) + s_2): rank order
    owned = flat[rank * 6 : rank * 6 + 6]
    return {
        "bitwise": torch.equal(owned, expected),
        "in_place": reduced.data_ptr() == mine.data_ptr() == owned.data_ptr(),
        "zeros_elsewhere": int(flat.count_nonzero()) == int(owned.count_nonzero()) == 6,
    }


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_p2p_reduce_scatter_sums_in_place_in_rank_order(world, world_size):
    for row in world(p2p_reduce_scatter, world_size):
        assert row == {"bitwise": True, "in_place": True, "zeros_elsewhere": True}
