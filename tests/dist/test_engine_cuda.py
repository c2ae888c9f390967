"""The engine with CUDA tensors (marked ``cuda``, outside the default run; scripts/device_check.sh runs it):
W=1 over NCCL and W=2 over Gloo with both ranks' tensors on one GPU, parity with DDP + Adam on the
same device, and every engine buffer on the parameters' device; the engine's step makes no host sync
(``torch.cuda.set_sync_debug_mode("error")``), and a collective's span is timed on the stream (CUDA
events): it covers the GPU work queued before its wait, which the host's clock would not see."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import batch, loss_of, make_model
from zero_lab import ShardedDataParallel
from zero_lab.runtime import spawn

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cuda_parity(steps: int = 4) -> dict[str, object]:
    rank, device = torch.distributed.get_rank(), torch.device("cuda", 0)
    reference, model = make_model().to(device), make_model().to(device)
    ddp = DDP(reference, device_ids=[0])
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with ShardedDataParallel(model, opt, bucket_cap_mb=0.001) as engine:
        for step in range(steps):
            for wrapped, optimizer in ((ddp, plain), (engine, opt)):
                optimizer.zero_grad()
                loss_of(wrapped, batch(step, rank).to(device)).backward()
                optimizer.step()
        engine.wait_for_params()
        devices = {t.device.type for t in [*engine.buffer.param_data, *engine.buffer._made]}
        devices |= {t.grad.device.type for t in engine.buffer.owned if t is not None and t.grad is not None}
        modes = engine.modes()
        stats = engine.comm_stats  # settled: every device span read
    diff = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters()))
    return {
        "diff": diff,
        "devices": sorted(devices),
        "grad_reduce": modes["grad_reduce"],
        "calls": stats.calls,
        "seconds": stats.seconds,
        "unread": len(engine.comm.stats._spans) + len(engine.param_comm.stats._spans),
    }


@pytest.mark.parametrize(("world", "backend"), [(1, "nccl"), (2, "gloo")])
def test_engine_with_cuda_tensors_matches_ddp(world, backend):
    results = spawn.run_world(_cuda_parity, world, (), backend=backend, start_method="spawn", timeout_s=180)
    for result in results:
        assert result["devices"] == ["cuda"]
        assert result["diff"] <= (0.0 if world == 1 else 1e-6), result
        assert result["unread"] == 0, result
        if world == 1:  # a shard group of one issues no collective
            assert result["calls"] == 0 and result["seconds"] == 0.0, result
        else:
            assert result["calls"] > 0 and result["seconds"] > 0, result


def _no_host_sync(steps: int = 3) -> dict[str, object]:
    """The engine's steps (W=1 NCCL) and a collective's issue and wait, with CUDA's sync check set to
    raise: none may make the host wait for the device. Then a collective's span on the stream."""
    from zero_lab.comm import Communicator

    device = torch.device("cuda", 0)
    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    comm = Communicator()
    tensor, work = torch.ones(1 << 20, device=device), torch.randn(2048, 2048, device=device)
    comm.all_reduce(tensor)  # NCCL's communicator is made (a host sync) before the check
    comm.stats.settle()
    inputs = [batch(step, 0).to(device) for step in range(steps)]  # a copy from host memory waits: before
    with ShardedDataParallel(model, opt, bucket_cap_mb=0.001) as engine:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for x in inputs:
                opt.zero_grad()
                loss_of(engine, x).backward()
                opt.step()
            pending = comm.issue_all_reduce(tensor)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(20):  # GPU work queued between the issue and the wait
                work = torch.tanh(work @ work)
            end.record()
            pending.wait()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    before = comm.stats.seconds
    span = comm.stats.snapshot().seconds - before
    return {"span": span, "work": begin.elapsed_time(end) / 1e3, "unread": len(comm.stats._spans)}


def test_engine_step_has_no_host_sync_and_collectives_are_timed_on_the_stream():
    (result,) = spawn.run_world(_no_host_sync, 1, (), backend="nccl", start_method="spawn", timeout_s=120)
    assert result["unread"] == 0 and result["work"] > 0, result
    assert result["span"] >= 0.99 * result["work"], result  # the span holds the work queued before its wait
