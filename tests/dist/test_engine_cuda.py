"""The engine with CUDA tensors (marked ``cuda``, outside the default run; scripts/device_check.sh runs it):
W=1 over NCCL and W=2 over Gloo with both ranks' tensors on one GPU, parity with DDP + Adam on the
same device, and every engine buffer on the parameters' device."""

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
    diff = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters()))
    return {"diff": diff, "devices": sorted(devices), "grad_reduce": modes["grad_reduce"]}


@pytest.mark.parametrize(("world", "backend"), [(1, "nccl"), (2, "gloo")])
def test_engine_with_cuda_tensors_matches_ddp(world, backend):
    results = spawn.run_world(_cuda_parity, world, (), backend=backend, start_method="spawn", timeout_s=180)
    for result in results:
        assert result["devices"] == ["cuda"]
        assert result["diff"] <= (0.0 if world == 1 else 1e-6), result
