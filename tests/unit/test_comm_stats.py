"""Communicator accounting in a world of one (in-process Gloo group): collectives in flight
together are timed once, so an exchange's time can never exceed the wall time around it."""

from __future__ import annotations

import time

import torch

from zero_lab.comm import Communicator


def test_overlapping_collectives_count_their_union_not_their_sum(single_rank_group):
    comm = Communicator()
    tensors = [torch.zeros(256) for _ in range(20)]
    start = time.perf_counter()
    pending = [comm.issue_broadcasts([(t, 0)]) for t in tensors]  # 20 units issued, then waited in turn
    for p in pending:
        p.wait()
    comm.all_reduce(torch.ones(4))  # a blocking one after them
    wall = time.perf_counter() - start
    assert (comm.stats.calls, comm.stats.bytes) == (21, 20 * 256 * 4 + 4 * 4)
    assert 0 < comm.stats.exposed_seconds <= comm.stats.seconds <= wall
