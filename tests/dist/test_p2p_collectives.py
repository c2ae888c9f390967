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


def links_by_peer() -> dict[str, dict[str, int]]:
    """W=4 as two nodes of two ranks (``per_node=2``): rank r sends 10·(p+1) floats to each peer p, then
    a p2p all-gather of ranges 5, 0, 7, 3 floats, then an all-reduce of 8 floats."""
    comm = Communicator(per_node=2)
    rank, peers = comm.rank, [p for p in range(4) if p != comm.rank]
    sends = [(torch.ones(10 * (p + 1)), p) for p in peers]
    recvs = [(torch.empty(10 * (rank + 1)), p) for p in peers]
    comm.issue_exchange(sends, recvs, tag=3).wait()
    exchanged = dict(comm.stats.sent_by_link)
    bounds = _bounds(4)
    storage = torch.zeros(bounds[-1][1])
    P2PAllGather().issue(comm, storage, bounds, "all_gather_p2p").wait()
    gathered = {k: v - exchanged.get(k, 0) for k, v in comm.stats.sent_by_link.items() if v > exchanged.get(k, 0)}
    before = dict(comm.stats.sent_by_link)
    comm.all_reduce(torch.ones(8))
    reduced = {k: v - before.get(k, 0) for k, v in comm.stats.sent_by_link.items() if v > before.get(k, 0)}
    return {"exchange": exchanged, "all_gather_p2p": gathered, "all_reduce": reduced}


def test_a_point_to_point_message_is_metered_on_its_peers_node(world):
    """Each send is charged to the link it takes: to the node's other rank ``intra_node``, to the
    two ranks of the other node ``inter_node``; a collective over both nodes, all ``inter_node``."""
    rows = world(links_by_peer, 4)
    for rank, row in enumerate(rows):
        mate = rank ^ 1
        others = [p for p in range(4) if p // 2 != rank // 2]
        assert row["exchange"] == {
            "intra_group": 4 * 10 * sum(p + 1 for p in range(4) if p != rank),
            "intra_node": 4 * 10 * (mate + 1),
            "inter_node": 4 * 10 * sum(p + 1 for p in others),
        }
        own = [5, 0, 7, 3][rank] * 4  # its range, once to each of its 3 peers
        assert row["all_gather_p2p"] == {
            k: v for k, v in {"intra_group": 3 * own, "intra_node": own, "inter_node": 2 * own}.items() if v
        }
        assert row["all_reduce"] == {"intra_group": 2 * 32 * 3 // 4, "inter_node": 2 * 32 * 3 // 4}
