"""PyTorch Lightning with zero_lab, unchanged: fit, ModelCheckpoint, ``ckpt_path=`` resume
(``torchrun``, 2 ranks: Lightning takes the torchelastic environment, strategy="ddp")."""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from tests.clients.scripts.common import digest, finish, out_dir, write_result
from zero_lab import Flat, ZeroRedundancyOptimizer


class Regression(pl.LightningModule):
    def __init__(self, optimizer: str):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        self.optimizer = optimizer

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        kwargs = {"lr": 1e-2, "weight_decay": 0.1}
        if self.optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), **kwargs)
        flat = self.optimizer == "zero_flat_bucket_view"
        return ZeroRedundancyOptimizer(
            self.parameters(),
            torch.optim.AdamW,
            partitioner=Flat() if flat else None,
            parameters_as_bucket_view=flat,
            **kwargs,
        )


def fit(optimizer: str, resume: str | None = None) -> tuple[Regression, pl.callbacks.ModelCheckpoint]:
    data = torch.utils.data.TensorDataset(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 2 batches per rank per epoch
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=str(out_dir() / optimizer), every_n_train_steps=2, save_top_k=-1, filename="{step}"
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=4,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints],
        default_root_dir=str(out_dir()),
    )
    module = Regression(optimizer)
    trainer.fit(module, loader, ckpt_path=resume)
    return module, checkpoints


def main() -> None:
    result = {}
    for optimizer in ("adamw", "zero", "zero_flat_bucket_view"):
        module, _ = fit(optimizer)
        result[optimizer] = digest(module)
        resumed, _ = fit(optimizer, resume=str(out_dir() / optimizer / "step=2.ckpt"))
        result[f"{optimizer}_resumed"] = digest(resumed)
    write_result(result)
    finish()


if __name__ == "__main__":
    main()
