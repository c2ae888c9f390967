"""HF Trainer (transformers) with zero_lab, unchanged: train, save, resume (``torchrun``, 2 ranks).

Runs, each a tiny GPT-2 from a config: AdamW for 4 steps; ZeroRedundancyOptimizer(AdamW) for 4
steps saving every 2; ZeRO resumed from checkpoint-2 by ``train(resume_from_checkpoint=...)``.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tests.clients.scripts.common import digest, finish, out_dir, write_result
from zero_lab import ZeroRedundancyOptimizer


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def run(name: str, optimizer: str, resume: str | None = None) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=str(out_dir() / name),
        use_cpu=True,
        ddp_backend="gloo",
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        weight_decay=0.1,
        logging_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    kwargs = {"lr": 1e-2, "weight_decay": 0.1}
    cls_and_kwargs = (
        (torch.optim.AdamW, kwargs)
        if optimizer == "adamw"
        else (ZeroRedundancyOptimizer, {"optimizer_class": torch.optim.AdamW, **kwargs})
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), optimizer_cls_and_kwargs=cls_and_kwargs)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def main() -> None:
    adamw = run("adamw", "adamw")
    zero = run("zero", "zero")
    resumed = run("zero", "zero", resume=str(out_dir() / "zero" / "checkpoint-2"))
    saved = torch.load(out_dir() / "zero" / "checkpoint-2" / "optimizer.pt", weights_only=True)
    reference = torch.load(out_dir() / "adamw" / "checkpoint-2" / "optimizer.pt", weights_only=True)
    same_state = saved["state"].keys() == reference["state"].keys() and all(
        torch.equal(saved["state"][i][k], v) for i, s in reference["state"].items() for k, v in s.items()
    )
    write_result(
        {
            "adamw": digest(adamw.model),
            "zero": digest(zero.model),
            "zero_resumed": digest(resumed.model),
            "saved_state_equals_adamw": same_state,
            "zero_class": type(zero.optimizer.optimizer).__name__,
        }
    )
    finish()


if __name__ == "__main__":
    main()
