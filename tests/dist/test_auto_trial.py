"""``auto`` (``exchange=`` and ``grad_reduce=``, one tuner: :mod:`zero_lab.auto`) is reproducible
and costs no memory.

Reproducible: a decision is remembered per process, so stability is shown across fresh process
pairs (each ``world(...)`` forks two new ranks), five of them. In each, two questions:

* a planted slow candidate that the phase *prefers* (moved to the front of the exchange's
  registry; for the gradient phase it claims to send no bytes) but that does strictly more work
  — every range broadcast :data:`WORK` times; :data:`WORK` throwaway all-reduces of the whole
  bucket before the real reduce-scatter — is displaced by the plain one every time, since that
  one is clearly faster (beyond the trial's noise, which on a loaded 2-core runner can reach the
  time itself: hence a large factor);
* a twin that does exactly the same work as the preferred candidate is a near-tie every time:
  the preferred one is chosen, and the report names the twin as within the noise.

No memory: the first step with ``exchange="auto"`` (trial included) raises the rank's peak
resident memory no more than the first step with the chosen collective forced (each in fresh
processes), and ``reduce_gradients(..., "auto")`` raises it by at most the model's gradient bytes
(which the first backward allocates after it) — measured with the kernel's counter of the peak
resident set (``VmHWM``, reset before the measured call through ``/proc/self/clear_refs``), which
sees every allocation, Gloo's threads' included; not wall time. Before this tuner the exchange's
trial staged a scratch of up to 16 MiB and the gradient trial three of DDP's buckets at once.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import loss_of
from tests.registries import restored_registries
from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab.collectives import Broadcast
from zero_lab.comm import Communicator
from zero_lab.grad_reduce import AllReduce, P2PReduceScatter, Reduced, reduce_gradients

FRESH_PAIRS = 5
#: How many times over the planted slow candidates do the work of the plain ones.
WORK = 16


def test_auto_chooses_the_same_in_fresh_process_pairs_and_never_the_planted_slow_candidate(world):
    rows = [world(decide_twice, 2)[0] for _ in range(FRESH_PAIRS)]
    for row in rows:
        assert row["slow"] == {"exchange": "broadcast", "grad_reduce": "reduce_scatter"}, row
        assert (
            row["slow_reports"]["exchange"]["timings_s"]["slow_broadcast"]
            > row["slow_reports"]["exchange"]["timings_s"]["broadcast"]
        ), row
        assert row["tie"] == {"exchange": "broadcast", "grad_reduce": "reduce_scatter"}, row
        assert row["tie_reports"]["exchange"]["within_noise"] == ["broadcast_twin"], row
        assert row["tie_reports"]["grad_reduce"]["within_noise"] == ["reduce_scatter_twin"], row
    assert all(row["slow"] == rows[0]["slow"] and row["tie"] == rows[0]["tie"] for row in rows)


@pytest.mark.parametrize("layout", ["per_shard", "flat_view", "flat"])
def test_the_exchange_trial_raises_the_peak_no_more_than_the_chosen_exchange(world, layout):
    auto = world(first_step_peak, 2, layout, "auto")
    chosen = auto[0]["collective"]
    assert chosen in ("broadcast", "p2p_all_gather") and all(row["collective"] == chosen for row in auto)
    forced = world(first_step_peak, 2, layout, chosen)
    for with_trial, without in zip(auto, forced):
        # a quarter of the model: the flat layout without views stages a buffer in every exchange, and a
        # trial's staging can outlive its wait on Gloo's thread by a moment (the scratch this trial replaced
        # was 16 MiB here, half the model)
        slack = with_trial["model_bytes"] // 4
        assert with_trial["peak"] <= without["peak"] + slack, (with_trial, without)
        assert with_trial["params"] == without["params"]  # the trial left every replica as the forced exchange
        assert with_trial["metered"] == without["metered"]  # and the trial is not counted as the step's traffic


def test_the_gradient_trial_raises_the_peak_by_less_than_the_gradients(world):
    for row in world(grad_trial_peak, 2):
        assert row["peak"] <= row["grad_bytes"] + row["grad_bytes"] // 8, row


# ---------------------------------------------------------------- rank programs
def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(512, 512) for _ in range(4)))  # 4 MiB of fp32 parameters


def _peak_of(run: Any) -> int:
    """How far ``run()`` raised this process's peak resident set above where it started (bytes).

    Every allocation of 64 KiB or more is made its own mapping, returned to the kernel when freed
    (glibc's ``M_MMAP_THRESHOLD``, fixed): the resident set then follows the live tensors, and
    freed memory parked in the allocator's arenas does not make the figure depend on history."""
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD

    def status(field: str) -> int:
        with open("/proc/self/status") as lines:
            return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

    with open("/proc/self/clear_refs", "w") as reset:
        reset.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    run()
    return status("VmHWM") - before


class SlowBroadcast(Broadcast):
    """Every range broadcast :data:`WORK` times: the same result, that many times the work."""

    name, label = "slow_broadcast", "exchange_slow_broadcast"

    def issue(self, comm, storage, bounds, op):  # type: ignore[no-untyped-def]
        for _ in range(WORK - 1):
            super().issue(comm, storage, bounds, op).wait()
        return super().issue(comm, storage, bounds, op)


class BroadcastTwin(Broadcast):
    name, label = "broadcast_twin", "exchange_broadcast_twin"


class SlowReduceScatter(P2PReduceScatter):
    """:data:`WORK` throwaway all-reduces of the whole bucket, then the real reduce-scatter; claims to
    send nothing (so the gradient phase prefers it)."""

    name, label = "slow_reduce_scatter", "grad_slow_reduce_scatter"

    def issue(self, comm: Communicator, segments, tag: int) -> Reduced:  # type: ignore[no-untyped-def]
        whole = torch.cat(list(segments))
        for _ in range(WORK):
            AllReduce().issue(comm, [whole], tag).wait()
        return super().issue(comm, segments, tag)

    def sent_bytes(self, numels, itemsize, world_size):  # type: ignore[no-untyped-def]
        return 0


class ReduceScatterTwin(P2PReduceScatter):
    name, label = "reduce_scatter_twin", "grad_reduce_scatter_twin"


def _only(table: Any, classes: tuple[type, ...]) -> None:
    """Make ``classes`` the registry's entries, in this order (the test owns the registry here)."""
    table._entries.clear()
    for cls in classes:
        table.register(cls)


def _decide(exchange_classes: tuple[type, ...], grad_classes: tuple[type, ...]) -> tuple[dict, dict]:
    from zero_lab import collectives, grad_reduce

    _only(collectives._REGISTRY, exchange_classes)
    _only(grad_reduce._REGISTRY, grad_classes)
    model = _model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=1e-3, exchange="auto")
    handle = reduce_gradients(ddp, opt, "auto")
    loss_of(ddp, torch.ones(4, 512)).backward()
    opt.step()
    handle.close()
    report = opt.exchange_report().as_dict()
    return {"exchange": report["collective"], "grad_reduce": handle.strategy}, {
        "exchange": report,
        "grad_reduce": handle.report(),
    }


def decide_twice() -> dict[str, Any]:
    with restored_registries():
        slow, slow_reports = _decide((SlowBroadcast, Broadcast), (SlowReduceScatter, P2PReduceScatter))
    with restored_registries():
        tie, tie_reports = _decide((Broadcast, BroadcastTwin), (P2PReduceScatter, ReduceScatterTwin))
    return {"slow": slow, "slow_reports": slow_reports, "tie": tie, "tie_reports": tie_reports}


def _big_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(8)))  # 32 MiB of fp32 parameters


def first_step_peak(layout: str, exchange: str) -> dict[str, Any]:
    kwargs = {
        "per_shard": {},
        "flat_view": {"partitioner": Flat(), "parameters_as_bucket_view": True},
        "flat": {"partitioner": Flat()},
    }[layout]
    model = _big_model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2, exchange=exchange, **kwargs)
    model(torch.randn(4, 1024, generator=torch.Generator().manual_seed(0))).pow(2).sum().backward()
    peak = _peak_of(opt.step)  # Adam's state, the exchange and, with auto, the trial
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {
        "collective": opt.exchange_report().collective,
        "peak": peak,
        "model_bytes": flat.numel() * 4,
        "metered": (opt.comm_stats.calls, opt.comm_stats.bytes, opt.comm_stats.sent_bytes),
        "params": hash(flat.numpy().tobytes()),
    }


def grad_trial_peak() -> dict[str, Any]:
    model = _big_model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    handles: list[Any] = []
    peak = _peak_of(lambda: handles.append(reduce_gradients(ddp, opt, "auto")))
    handles[0].close()
    dist.barrier()
    return {"peak": peak, "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
