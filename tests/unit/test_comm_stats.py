"""Communicator accounting in a world of one (in-process Gloo group): collectives in flight
together are timed once, so an exchange's time can never exceed the wall time around it; device
spans (CUDA events, stood in for here) are read when the totals are, as their union; CPU tensors
are timed on the host. The CUDA path itself: tests/dist/test_engine_cuda.py (scripts/device_check.sh)."""

from __future__ import annotations

import time

import pytest
import torch

from zero_lab.comm import SPANS_KEPT, Clock, CommStats, Communicator


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


class _Mark:
    """A stand-in for a CUDA event at ``ms`` milliseconds on the device's timeline."""

    def __init__(self, ms: float):
        self.ms, self.synchronized = ms, False

    def synchronize(self) -> None:
        self.synchronized = True

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Mark) -> float:
        return end.ms - self.ms


def test_device_spans_count_their_union_when_settled():
    """Device spans (CUDA events) are kept unread while stepping and added as their union when the
    totals are read: [0, 10] and [5, 20] ms overlap (20 ms), [30, 40] ms adds 10."""
    stats = CommStats(seconds=1.0)
    marks = [(_Mark(a), _Mark(b)) for a, b in ((0, 10), (5, 20), (30, 40))]
    for start, end in marks:
        stats.add_span(start, end)
    assert stats.seconds == 1.0  # nothing read yet
    assert stats.snapshot().seconds == pytest.approx(1.030)
    assert all(end.synchronized for _, end in marks) and stats.seconds == pytest.approx(1.030)
    stats.add_span(_Mark(35), _Mark(50))  # overlaps what was counted: only [40, 50] is new
    assert stats.since(CommStats(seconds=1.0)).seconds == pytest.approx(0.040)


def test_unread_device_spans_are_counted_once_over():
    """Totals nobody reads keep at most SPANS_KEPT spans: those already over are counted as they go."""
    stats = CommStats()
    for i in range(3 * SPANS_KEPT):
        stats.add_span(_Mark(10 * i), _Mark(10 * i + 4))
    assert len(stats._spans) < SPANS_KEPT
    assert stats.settle().seconds == pytest.approx(3 * SPANS_KEPT * 0.004)


def test_cpu_collectives_are_timed_on_the_host(single_rank_group):
    """CPU tensors: no device clock, every span on ``perf_counter`` at once (nothing left to settle)."""
    comm = Communicator()
    tensor = torch.ones(8)
    assert comm.device_clock(tensor) is None and Clock("cpu").cuda is False
    comm.issue_all_reduce(tensor).wait()
    comm.all_reduce(tensor)
    assert not comm.stats._spans and comm.stats.seconds > 0
    start = Clock().mark()
    assert isinstance(start, float) and Clock.seconds(start, Clock().mark()) >= 0
