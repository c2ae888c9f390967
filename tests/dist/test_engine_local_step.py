"""The engine's local step (``time/optim_step_s``, the Muon benchmark's ``local``) leaves out its gathers.

Read on a clock that moves one second at every reading (``time.perf_counter`` replaced inside the
ranks): a span's seconds count the readings inside it, so whatever the load a span that contains the
parameter all-gather (metered by the engine's :class:`~zero_lab.comm.CommStats`, several readings) is
longer than one second, and the optimizer's own step, which reads no clock, is exactly one.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
import torch.distributed as dist

from tests.dist.training import batch, loss_of, make_model
from zero_lab import ShardedDataParallel
from zero_lab.app.record.metrics import LocalStepClock
from zero_lab.bench.muon import muon_rank

#: a tiny TinyLM for the Muon benchmark's engine row (matrices to Muon, the rest to AdamW)
TINY_LM = {"vocab_size": 64, "seq_len": 8, "d_model": 16, "n_layer": 1, "n_head": 2, "n_kv_head": 1}


def _app_reader(steps: int) -> dict[str, list[float]]:
    """The app's reader (made after the engine, as the app's ``Training`` is) around each ``step()``."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine = ShardedDataParallel(model, opt, prefetch=False, bucket_cap_mb=0.001)  # the gathers waited in step()
    clock = LocalStepClock(opt)
    local, gathered = [], []
    for step in range(steps):
        opt.zero_grad()
        loss_of(engine, batch(step, dist.get_rank())).backward()
        before, meter = clock.seconds(), engine.param_comm.stats.snapshot()
        opt.step()
        local.append(clock.seconds() - before)
        gathered.append(engine.param_comm.stats.since(meter).seconds)
    engine.close()
    return {"local": local, "gathered": gathered, "engine": [engine.local_step_seconds]}


def _ticking_program() -> dict[str, Any]:
    real = time.perf_counter
    ticks = itertools.count(1.0)
    time.perf_counter = lambda: next(ticks)  # one second later at every reading
    try:
        out: dict[str, Any] = _app_reader(3)
        muon = muon_rank(TINY_LM, ["zl_engine"], warmup=0, steps=2, order="model", batch=2)["zl_engine"]
    finally:
        time.perf_counter = real
    return {**out, "muon_local": muon["local_s"], "muon_step": muon["step_s"]}


def test_the_local_step_leaves_out_the_parameter_gather(world):
    for result in world(_ticking_program, 2):
        assert all(seconds >= 2.0 for seconds in result["gathered"]), result  # each step's gathers, metered
        # the span's two ends only: no collective inside (before, the app's clock spanned the gathers)
        assert result["local"] == [1.0, 1.0, 1.0], result
        assert result["engine"] == [3.0], result
        assert result["muon_local"] == [1.0, 1.0], result
        assert all(step > 3.0 for step in result["muon_step"]), result  # step() itself: reductions + gathers
