"""What one rank's training holds in memory, measured from its tensors, and the "÷ DDP" baseline
the planner predicts from the run plan's specs: the figures behind ``memory/*``.

The baseline compares like with like: DDP + the same optimizer, priced over the parameters that
have state in this run (OR-ed over the ranks). A parameter that never gets a gradient gets no
state under either, so it is not counted as saved.

    training_tensor_bytes(training)                        # params + grads + buffers + local state
    ddp_state_bytes(plan.specs, training.optimizer, held)  # what DDP + the same optimizer would hold
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from zero_lab.app.plan.strategy import Strategy
from zero_lab.app.run.training import Training
from zero_lab.partition import ParamSpec
from zero_lab.planner import plan_memory

__all__ = ["ddp_state_bytes", "optimizer_classes", "training_tensor_bytes"]


def training_tensor_bytes(training: Training) -> int:
    """Bytes of every distinct storage this rank trains with: parameters, gradients, module buffers, the
    local optimizer's parameters (fp32 master shards) and state. Per storage, so bucket views and flat
    slices count once; DDP's own gradient buckets live in C++ and are not seen here (the planner prices them)."""
    local = training.strategy.local_optimizer(training.optimizer)
    params = list(training.model.parameters())
    tensors = [
        *params,
        *(param.grad for param in params),
        *training.model.buffers(),
        *(param for group in local.param_groups for param in group["params"]),
        *(value for state in local.state.values() for value in state.values()),
    ]
    storages: dict[int, int] = {}
    for tensor in tensors:
        if torch.is_tensor(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    storages.pop(0, None)  # empty storages
    return sum(storages.values())


def optimizer_classes(optimizer: Optimizer) -> list[type]:
    """The classes that hold the state, each once, in param-group order (``[Muon, AdamW]``)."""
    return list(dict.fromkeys(Strategy.of_optimizer(optimizer).group_classes(optimizer)))


def ddp_state_bytes(specs: Sequence[ParamSpec], optimizer: Optimizer, held: Sequence[bool] | None = None) -> int:
    """Per-rank state of DDP + the same optimizer as :func:`zero_lab.planner.plan_memory` predicts it
    (no partitioner). ``specs``: the run plan's, one per parameter of ``optimizer.param_groups`` in
    order; ``held``: per parameter, whether any rank holds state for it (only those are priced;
    ``None``: every trainable one). The optimizer answers which class steps each group, with which options."""
    strategy = Strategy.of_optimizer(optimizer)
    count = len(strategy.params_with_state(optimizer))  # the model's parameters (the engine re-points its optimizer)
    if len(specs) != count:
        raise ValueError(f"specs: {len(specs)} for the optimizer's {count} parameters; pass the run plan's")
    if held is not None:
        if len(held) != count:
            raise ValueError(f"held: {len(held)} flags for {count} parameters")
        specs = [spec for spec, kept in zip(specs, held) if kept]
    classes = strategy.group_classes(optimizer)
    if len(set(classes)) > 1:  # routed: each group priced by the class that steps it
        per_group = [(cls, _plain_options(cls, group)) for cls, group in zip(classes, optimizer.param_groups)]
        plan = plan_memory(specs, 1, None, classes[0], group_optimizers=per_group)
        return plan.ranks[0].state_bytes
    local = strategy.local_optimizer(optimizer)
    options = _plain_options(type(local), local.defaults)
    plan = plan_memory(specs, 1, None, type(local), **options)
    return plan.ranks[0].state_bytes


def _plain_options(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments of ``cls`` among ``values`` that a config could hold."""
    accepted = inspect.signature(cls).parameters  # defaults may hold keys the constructor sets itself
    return {k: v for k, v in values.items() if k in accepted and isinstance(v, (bool, int, float, str))}
