"""Count the collectives any code issues, from the profiler, without patching ``torch.distributed``.

zero_lab meters its own collectives (:attr:`ZeroRedundancyOptimizer.comm_stats`);
torch's ``ZeroRedundancyOptimizer``, FairScale's ``OSS``, DDP and FSDP2 do not. Their
collectives are read from ``torch.profiler``: the backend records one event per
collective (``gloo:broadcast``, ``gloo:all_gather``, ``nccl:...``) with the shapes of
its input tensors, so the payload is the product of those shapes. Byte accounting is
:class:`~zero_lab.comm.Communicator`'s: a broadcast or all-reduce of ``n`` bytes counts
``n``; an all-gather counts its output (the local input × world size).

Collectives are sorted into two kinds: ``params`` (broadcast, all-gather: moving
parameters) and ``grads`` (all-reduce, reduce-scatter, and point-to-point sends and receives);
point-to-point sends and receives issued inside zero_lab's exchange (under a
``zero_lab::exchange_p2p…`` profiler range: ``exchange="p2p_all_gather"``) are ``params``; barriers
and anything else count nowhere. The profiler costs time, so the benchmark meters one
untimed iteration per strategy (its memory phase). Kineto writes a ``USDT: ...
profiler_start`` / ``profiler_stop`` line to file descriptor 2 from C++ at every start and
stop (``KINETO_LOG_LEVEL`` does not silence them): the meter holds them back, and lets any
other line through::

    with CollectiveMeter(element_size=4, world_size=2) as meter:
        loss.backward(); optimizer.step()
    meter.totals()   # {"params": CommStats(calls, bytes, 0.0), "grads": ...}
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from torch.profiler import ProfilerActivity, profile

from zero_lab.comm import CommStats

__all__ = ["CollectiveMeter", "kind_of"]

_BACKENDS = ("gloo:", "nccl:", "mpi:", "ucc:")


def kind_of(op: str) -> str | None:
    """``params`` / ``grads`` for a collective's name (without backend prefix), else ``None``."""
    op = op.lower()
    if "reduce" in op or op in ("send", "recv"):  # point-to-point: the gradient reduce-scatter's (grad_reduce)
        return "grads"
    if "broadcast" in op or "gather" in op:
        return "params"
    return None


class CollectiveMeter:
    """A profiler window; :meth:`totals` gives calls and bytes per kind of collective.

    ``element_size`` is the bytes per element of the exchanged tensors (the profiler
    records shapes, not dtypes; every benchmark model is in one dtype).
    """

    def __init__(self, element_size: int, world_size: int):
        self.element_size = element_size
        self.world_size = world_size
        self._profile = profile(activities=[ProfilerActivity.CPU], record_shapes=True)

    def __enter__(self) -> CollectiveMeter:
        with _without_profiler_notes():
            self._profile.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        with _without_profiler_notes():
            self._profile.__exit__(kind, error, trace)

    def totals(self) -> dict[str, CommStats]:
        out = {"params": CommStats(), "grads": CommStats()}
        events = self._profile.events()
        exchange = [event for event in events if event.name.startswith("zero_lab::exchange_p2p")]
        for event in events:
            if not event.name.startswith(_BACKENDS):
                continue
            op = event.name.split(":", 1)[1]
            kind = "params" if op in ("send", "recv") and _issued_in(event, exchange) else kind_of(op)
            if kind is None or not event.input_shapes or not event.input_shapes[0]:
                continue
            numel = math.prod(event.input_shapes[0])
            if "gather" in op:
                numel *= self.world_size  # the local input, W times: the output
            out[kind].calls += 1
            out[kind].bytes += numel * self.element_size
        return out


def _issued_in(event: Any, ranges: Sequence[Any]) -> bool:
    """Whether ``event`` started inside one of the profiler ``ranges`` on its thread (an asynchronous
    send or receive ends after the range that issued it, so it is not that range's child)."""
    start = event.time_range.start
    return any(r.thread == event.thread and r.time_range.start <= start <= r.time_range.end for r in ranges)


@contextlib.contextmanager
def _without_profiler_notes() -> Iterator[None]:
    """File descriptor 2 into a temporary file for the block; then every line but Kineto's ``USDT:`` back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))
