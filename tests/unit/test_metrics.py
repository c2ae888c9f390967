"""The per-step metric record's keys and arithmetic, real optimizer-state bytes, the progress bar."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import termios

import pytest
import torch

from zero_lab.app.record.metrics import RankStep, step_record
from zero_lab.app.record.progress import Progress
from zero_lab.app.run.memory import ddp_state_bytes, training_tensor_bytes
from zero_lab.app.run.training import Training
from zero_lab.measure import optimizer_state_bytes
from zero_lab.planner import specs_from_module

#: The per-rank metric prefixes users chart; each has /rank{r}, /max and /mean.
PER_RANK = (
    "time/step_s",
    "time/exchange_s",
    "comm/exchange_bytes",
    "comm/exchange_calls",
    "memory/optim_state_bytes",
    "memory/tensor_bytes",
    "memory/peak_bytes",
)


def test_step_record_has_per_rank_values_max_and_mean():
    ranks = [
        RankStep(loss=1.0, step_s=0.2, exchange_s=0.05, exchange_bytes=100, optim_state_bytes=10, samples=8),
        RankStep(loss=3.0, step_s=0.4, exchange_s=0.15, exchange_bytes=100, optim_state_bytes=30, samples=8),
    ]
    record = step_record(7, ranks, imbalance=1.25)
    assert record["step"] == 7
    assert (record["train/loss"], record["train/loss/rank0"], record["train/loss/rank1"]) == (2.0, 1.0, 3.0)
    assert (record["time/step_s/max"], record["time/step_s/mean"]) == (0.4, pytest.approx(0.3))
    assert (record["memory/optim_state_bytes/rank1"], record["memory/optim_state_bytes/mean"]) == (30, 20)
    assert record["train/samples_per_s"] == pytest.approx(16 / 0.4)  # global batch / slowest rank
    assert record["memory/imbalance"] == 1.25
    for prefix in PER_RANK:
        assert {f"{prefix}/rank0", f"{prefix}/rank1", f"{prefix}/max", f"{prefix}/mean"} <= record.keys()


def test_optimizer_state_bytes_come_from_the_real_state_tensors():
    model = torch.nn.Linear(10, 5)
    optimizer = torch.optim.Adam(model.parameters())
    assert optimizer_state_bytes(optimizer) == 0  # Adam allocates its state at the first step
    model(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    moments = 2 * 4 * sum(p.numel() for p in model.parameters())  # exp_avg + exp_avg_sq, float32
    assert moments <= optimizer_state_bytes(optimizer) <= moments + 2 * 8  # + one `step` scalar per param


def stepped(optimizer_class: type[torch.optim.Optimizer], **options) -> Training:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.BatchNorm1d(5))
    optimizer = optimizer_class(model.parameters(), lr=0.1, **options)
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
    return Training(model=model, ddp=None, optimizer=optimizer, zero=False)  # type: ignore[arg-type]


def test_tensor_bytes_count_params_grads_buffers_and_state_each_once():
    training = stepped(torch.optim.Adam)
    model = training.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # running stats + int64 counter
    state = optimizer_state_bytes(training.optimizer)
    assert state > 0 and buffers == 2 * 5 * 4 + 8
    # the optimizer's param_groups hold the model's own parameters: counted once, not twice
    assert training_tensor_bytes(training) == 2 * params + buffers + state


def test_ddp_state_bytes_is_the_planners_number_and_matches_the_real_state():
    cases = (
        (torch.optim.Adam, {}),
        (torch.optim.AdamW, {"amsgrad": True}),  # its defaults hold a key its constructor refuses
        (torch.optim.SGD, {"momentum": 0.9}),
        (torch.optim.SGD, {}),
    )
    for optimizer_class, options in cases:
        training = stepped(optimizer_class, **options)
        specs = specs_from_module(training.model)  # the run plan's, for this model
        assert ddp_state_bytes(specs, training.optimizer) == optimizer_state_bytes(training.optimizer)
    assert ddp_state_bytes(specs, training.optimizer) == 0  # plain SGD keeps no state


def test_progress_bar_stays_quiet_without_a_terminal(capsys):
    with Progress(total=3, enabled=True) as bar:  # pytest captures stderr: not a TTY
        bar.update({"train/loss": 1.0})
    assert capsys.readouterr().err == ""


def test_progress_bar_draws_steps_and_loss_on_a_terminal():
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    with os.fdopen(follower, "w") as terminal, Progress(total=3, enabled=True, stream=terminal) as bar:
        bar.update({"train/loss": 0.25})
        drawn = _read_available(leader)
    os.close(leader)
    assert "1/3" in drawn and "loss=0.25" in drawn


def _read_available(fd: int) -> str:
    """Everything written to a pty so far (written before the call: 0.1 s of silence ends the read)."""
    chunks = []
    while select.select([fd], [], [], 0.1)[0]:
        chunks.append(os.read(fd, 4096))
    return b"".join(chunks).decode(errors="replace")
