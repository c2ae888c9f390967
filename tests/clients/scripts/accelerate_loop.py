"""accelerate with zero_lab, unchanged: prepare, save_state, load_state (``torchrun``, 2 ranks).

For AdamW, ZeroRedundancyOptimizer(AdamW) and the same with ``parameters_as_bucket_view=True``:
train 4 steps with ``save_state`` after step 2 (safetensors model, accelerate's default), then a
fresh model + optimizer ``load_state`` that checkpoint and train steps 3-4.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from tests.clients.scripts.common import digest, finish, out_dir, write_result
from zero_lab import ZeroRedundancyOptimizer


def build(optimizer: str) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    """A fresh Accelerator (it saves every model it prepared) with this run's model and optimizer."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    kwargs = {"lr": 1e-2, "weight_decay": 0.1}
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    else:
        bucket_view = optimizer == "zero_bucket_view"
        opt = ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.AdamW, parameters_as_bucket_view=bucket_view, **kwargs
        )
    return accelerator, *accelerator.prepare(model, opt)


def train(accelerator: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + accelerator.process_index))
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()


def main() -> None:
    result = {}
    for optimizer in ("adamw", "zero", "zero_bucket_view"):
        accelerator, model, opt = build(optimizer)
        train(accelerator, model, opt, range(2))
        checkpoint = out_dir() / optimizer
        accelerator.save_state(str(checkpoint))
        train(accelerator, model, opt, range(2, 4))
        result[optimizer] = digest(model)
        accelerator, model, opt = build(optimizer)
        accelerator.load_state(str(checkpoint))
        train(accelerator, model, opt, range(2, 4))
        result[f"{optimizer}_resumed"] = digest(model)
        result[f"{optimizer}_files"] = sorted(p.name for p in checkpoint.iterdir())
    write_result(result)
    finish()


if __name__ == "__main__":
    main()
