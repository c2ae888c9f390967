"""One optimizer step of a rank, and the validation loss: the loop's arithmetic, importable.

:func:`forward_backward` cuts this rank's batch into ``accumulate`` equal micro-batches and runs
forward + backward on each, all but the last inside DDP's ``no_sync`` (gradients accumulate
locally and are all-reduced once, in the last backward). Each micro-batch's loss is divided by
``accumulate``: the gradient is that of the mean over the rank's rows, as without accumulation,
so the global batch and the world-size-invariant trajectory are kept. ``autocast`` runs forward
and loss under ``torch.autocast`` (bf16, or fp16 with torch's ``GradScaler`` scaling the loss).
Then :func:`unscale_and_clip` and :func:`apply_step`; :func:`measured_step` runs the three for
the rank loop and measures between them (:class:`~zero_lab.app.record.metrics.RankStep`).

    loss = forward_backward(training, data, batch, StepOptions(accumulate=4, autocast="bf16"), device)
    grad_norm = unscale_and_clip(training)
    apply_step(training)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from zero_lab.app.config.schema import enum_str
from zero_lab.app.record.metrics import RankStep, peak_memory_bytes
from zero_lab.app.run.memory import training_tensor_bytes
from zero_lab.app.run.training import Training
from zero_lab.app.workloads.protocols import OUTPUT_KEY, Batch, Inputs, batch_rows, call_model, loss_of, to_device
from zero_lab.comm import INTER_GROUP, INTER_NODE, CommStats, Communicator
from zero_lab.grad_reduce import held_grad_bytes
from zero_lab.measure import optimizer_state_bytes

__all__ = [
    "AUTOCAST_DTYPES",
    "StepOptions",
    "apply_step",
    "forward_backward",
    "measured_step",
    "micro_batches",
    "unscale_and_clip",
    "validation_loss",
]

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepOptions:
    """The loop's keys that shape a step: ``output_key``, ``accumulate``, ``autocast``."""

    output_key: str = OUTPUT_KEY
    accumulate: int = 1
    autocast: str | None = None

    @classmethod
    def of(cls, cfg: Any) -> StepOptions:
        autocast = cfg.get("autocast")
        return cls(
            output_key=str(cfg.get("output_key", OUTPUT_KEY)),
            accumulate=int(cfg.get("accumulate", 1)),
            autocast=enum_str(autocast) if autocast is not None else None,
        )


def micro_batches(batch: Batch, count: int) -> list[Batch]:
    """``batch`` cut into ``count`` equal consecutive row ranges (inputs, or each input of a mapping, and targets)."""
    if count == 1:
        return [batch]
    inputs, targets = batch

    def cut(tensor: torch.Tensor) -> list[torch.Tensor]:
        if tensor.shape[0] % count:
            raise ValueError(f"accumulate={count}: a batch of {tensor.shape[0]} rows per rank does not split evenly")
        return list(tensor.chunk(count))

    pieces: list[Inputs] = (
        [dict(zip(inputs, parts)) for parts in zip(*(cut(v) for v in inputs.values()))]
        if isinstance(inputs, Mapping)
        else cut(inputs)
    )
    target_pieces = cut(targets) if torch.is_tensor(targets) else [targets] * count
    return list(zip(pieces, target_pieces))


def _on_device(batch: Batch, device: torch.device, dtype: torch.dtype) -> Batch:
    """The batch on ``device``; floating inputs in ``dtype`` (bf16/fp16 models take inputs in their dtype)."""
    inputs, targets = batch
    return to_device(inputs, device, dtype), targets.to(device) if torch.is_tensor(targets) else targets


def _autocast(options: StepOptions, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if options.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[options.autocast])


def forward_backward(
    training: Training, data: Any, batch: Batch, options: StepOptions, device: torch.device
) -> torch.Tensor:
    """Forward and backward over ``options.accumulate`` micro-batches; returns the (detached)
    loss of the rank's whole batch. The caller zeroes gradients before and steps after."""
    parts = micro_batches(_on_device(batch, device, training.param_dtype), options.accumulate)
    total = torch.zeros((), device=device)
    for index, (micro_inputs, micro_targets) in enumerate(parts):
        last = index == len(parts) - 1
        sync = contextlib.nullcontext() if last else training.ddp.no_sync()  # all-reduce once, in the last backward
        with sync:
            with _autocast(options, device):
                output = call_model(training.ddp, micro_inputs)
                loss = loss_of(output, micro_targets, data, options.output_key) / len(parts)
            (training.scaler.scale(loss) if training.scaler is not None else loss).backward()
        total += loss.detach()
    return total


def unscale_and_clip(training: Training) -> float | None:
    """Clip to ``optim.max_grad_norm`` between backward and step; returns the pre-clip norm (``None``:
    not clipping). fp16 unscales first (only when clipping: the scaler's step unscales otherwise). The
    strategy computes the global norm: torch's clip under plain DDP (every rank holds every gradient),
    one scalar all-reduce of the ranks' norms of what they own under ZeRO and the engine."""
    if training.max_grad_norm is None:
        return None
    if training.scaler is not None:
        training.scaler.unscale_(training.optimizer)  # clip the true gradients, not the scaled ones
    return float(training.strategy.clip_grad_norm(training.model, training.optimizer, training.max_grad_norm))


def apply_step(training: Training) -> None:
    """Step (through the scaler, which skips a step with inf/nan gradients), then the scheduler."""
    if training.scaler is not None:
        training.scaler.step(training.optimizer)
        training.scaler.update()
    else:
        training.optimizer.step()  # ZeRO: step own shards, then exchange parameters
    if training.scheduler is not None:
        training.scheduler.step()


def validation_loss(
    training: Training, data: Any, batches: int, options: StepOptions, device: torch.device, comm: Communicator
) -> float:
    """Mean loss of held-out batches ``0..batches-1`` (``data.val_shard(index, rank, world_size)``)
    over every rank of ``comm``, in eval mode and without gradients (the unwrapped model: no DDP hooks)."""
    rank, world_size = comm.rank, comm.world_size
    model = training.model
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    try:
        with torch.no_grad():
            for index in range(batches):
                inputs, targets = _on_device(data.val_shard(index, rank, world_size), device, training.param_dtype)
                with _autocast(options, device):
                    loss = loss_of(call_model(model, inputs), targets, data, options.output_key)
                total += loss.double()
    finally:
        model.train(was_training)
    comm.all_reduce(total, op="validation")
    return float(total) / (batches * world_size)


def _waited(training: Training) -> float:
    """Seconds the loop has waited for gradient reductions so far (the grad_reduce= hook's own clock,
    else the engine's meter; 0 where nothing reduces but DDP)."""
    if training.grad_reducer is not None:
        return training.grad_reducer.exposed_seconds
    return training.grad_stats.exposed_seconds if training.grad_stats is not None else 0.0


def measured_step(training: Training, data: Any, batch: Batch, options: StepOptions, device: torch.device) -> RankStep:
    """One optimizer step on this rank's batch — zero the gradients, :func:`forward_backward`,
    :func:`unscale_and_clip`, :func:`apply_step` — timed, with what it sent and holds measured
    (an exchange or a gradient reduction the run does not have measures zero)."""
    comm = training.exchange_stats or CommStats()
    before = comm.snapshot()
    reducer = training.grad_reducer
    grads = training.grad_stats or CommStats()
    grads_before = grads.snapshot()
    exposed_before = _waited(training)
    local_before = training.step_clock.seconds()
    start = time.perf_counter()
    training.optimizer.zero_grad(set_to_none=True)
    loss = forward_backward(training, data, batch, options, device)  # DDP all-reduces in the last backward
    grad_bytes = held_grad_bytes(list(training.model.parameters()), reducer)  # + DDP's buckets, with grad_reduce=
    grad_norm = unscale_and_clip(training)  # optim.max_grad_norm: the global norm, before any shard steps
    if grad_norm is not None:
        before = comm.snapshot()  # the norm's all-reduce is not exchange (clipping rules out overlap)
    apply_step(training)  # ZeRO: step own shards, then exchange parameters; then the LR scheduler
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    exchange, reduced = comm.since(before), grads.since(grads_before)
    return RankStep(
        loss=loss.item(),
        step_s=elapsed,
        exchange_s=exchange.seconds,
        exchange_exposed_s=exchange.exposed_seconds,
        exchange_bytes=exchange.bytes,
        exchange_calls=exchange.calls,
        optim_state_bytes=optimizer_state_bytes(training.optimizer),
        master_weight_bytes=training.strategy.master_weight_bytes(training.optimizer),
        tensor_bytes=training_tensor_bytes(training),
        peak_bytes=peak_memory_bytes(device),
        samples=batch_rows(batch[0]),
        grad_norm=grad_norm if grad_norm is not None else 0.0,
        optim_step_s=training.step_clock.seconds() - local_before,
        grad_reduce_bytes=reduced.sent_bytes,
        exchange_sent_bytes=exchange.sent_bytes,
        grad_reduce_s=reduced.seconds,
        grad_reduce_exposed_s=_waited(training) - exposed_before,
        grad_bytes=grad_bytes,
        grad_reduce_inter_group_bytes=reduced.sent_by_link.get(INTER_GROUP, 0),
        grad_reduce_inter_node_bytes=reduced.sent_by_link.get(INTER_NODE, 0),
        exchange_inter_group_bytes=exchange.sent_by_link.get(INTER_GROUP, 0),
        exchange_inter_node_bytes=exchange.sent_by_link.get(INTER_NODE, 0),
    )
