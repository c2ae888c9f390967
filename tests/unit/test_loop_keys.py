"""The loop's keys (no processes): torch's schedulers with warmup keep per-group LRs; what the
pre-start check refuses (accumulation that does not split the batch, autocast combinations,
validation without held-out data) and says."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tests.preflight import compose_job, problems
from zero_lab.app.run.build import make_scheduler
from zero_lab.app.run.step import micro_batches


def test_warmup_then_cosine_scales_every_group_by_the_same_factor():
    cfg, _, _ = compose_job(["scheduler=cosine", "scheduler.warmup_steps=3", "steps=10"])
    weights, biases = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [weights], "lr": 0.1}, {"params": [biases], "lr": 0.01}])
    scheduler = make_scheduler(OmegaConf.create(cfg), opt)
    seen = []
    for _ in range(8):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        scheduler.step()
    assert [round(lr / 0.1, 6) for lr, _ in seen[:4]] == [0.25, 0.5, 0.75, 1.0]  # 1/(w+1) .. 1
    assert all(lr0 == pytest.approx(10 * lr1) for lr0, lr1 in seen)  # the groups' ratio is kept
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(torch.optim.SGD([torch.zeros(1)], lr=0.1), T_max=10)
    expected = []
    for _ in range(5):
        expected.append(cosine.get_last_lr()[0])
        cosine.optimizer.step()
        cosine.step()
    assert [lr for lr, _ in seen[3:]] == pytest.approx(expected)  # then torch's cosine, from the warmup's end


def test_scheduler_keys_come_from_torchs_signatures_and_none_is_the_default():
    cfg, choices, _ = compose_job([])
    assert choices["scheduler"] == "none" and make_scheduler(cfg, torch.optim.SGD([torch.zeros(1)], lr=1)) is None
    cfg, _, _ = compose_job(["scheduler=step", "scheduler.gamma=0.1", "scheduler.step_size=3"])
    assert (cfg.scheduler.gamma, cfg.scheduler.step_size, cfg.scheduler.warmup_steps) == (0.1, 3, 0)
    message = problems("scheduler=step", "scheduler.gama=1")
    assert "scheduler.gama: no such key; did you mean scheduler.gamma?" in message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["accumulate=3"], "accumulate=3: each rank's 16 rows per step (data.global_batch=32 over dist.world_size=2)"),
        (["accumulate=0"], "accumulate=0: must be >= 1"),
        (["autocast=fp16", "overlap=true"], "autocast=fp16 with overlap=true: the GradScaler must unscale"),
        (["autocast=bf16", "param_dtype=bfloat16"], "autocast=bf16 with param_dtype=bfloat16:"),
        (["autocast=fp8"], "autocast=fp8"),
        (["scheduler=warmup", "scheduler.warmup_steps=-1"], "scheduler.warmup_steps=-1: must be >= 0"),
        (["eval_every=-2"], "eval_every=-2: must be >= 0"),
    ],
)
def test_loop_keys_are_checked_before_start(overrides, expected):
    assert expected in problems(*overrides)


def test_micro_batches_split_rows_of_tensors_and_dicts():
    x, y = torch.arange(8).view(4, 2), torch.arange(4)
    parts = micro_batches((x, y), 2)
    assert [p[1].tolist() for p in parts] == [[0, 1], [2, 3]]
    dict_parts = micro_batches(({"input_ids": x, "labels": x}, None), 4)
    assert [p[0]["labels"].tolist() for p in dict_parts] == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]]
