"""Predict per-rank memory of ZeRO stage 1 at any world size — no process group, no tensors.

The planner runs the *real* partitioner on :class:`~zero_lab.partition.ParamSpec`
records (built by hand, or from a model on the ``meta`` device, which allocates
nothing) and prices every rank's shards with the optimizer's state layout::

    with torch.device("meta"):
        model = build_model()
    specs = specs_from_module(model)
    plan = plan_memory(specs, world_size=1024, partitioner=Flat(), optimizer_class=torch.optim.Adam)
    print(plan.table())

What each rank holds, per :class:`RankMemory`:

* ``param_bytes`` — the full replica of every parameter (ZeRO-1 keeps them all);
* ``grad_bytes`` — one gradient per trainable parameter (DDP all-reduces them all); with
  ``release_grads=True`` (``zero_lab.grad_reduce``) only those of the parameters the rank owns
  an element of, each whole (what ``param.grad`` holds after backward; during backward all);
* ``ddp_buffer_bytes`` — DDP's gradient buckets, a second copy of the gradients unless
  DDP runs with ``gradient_as_bucket_view=True``; with ``release_grads=True`` none after
  backward (``zero_lab.grad_reduce`` frees their storage until the next backward);
* ``state_bytes`` — the local optimizer's state for the shards this rank owns;
* ``master_bytes`` — fp32 master copies of owned bf16/fp16 shards (``master_weights``).

The optimizer's state layout is not a table kept by hand: :func:`probe_state_rule`
asks the real optimizer class what it makes for 2- and 3-element tensors
(:func:`zero_lab.state_probe.expected_state`, one step on ``meta`` tensors) and records which
state entries grow with the tensor (``exp_avg``) and which are fixed (Adam's
``step`` scalar). zero_lab steps one tensor per shard (a whole parameter, or a slice
of it for element-granular partitioners), so a rank's state is the sum of that rule
over its shards — exactly what :func:`zero_lab.measure.optimizer_state_bytes` counts
on a ``ZeroRedundancyOptimizer`` after the first step, provided every trainable parameter received a gradient.

A *whole* parameter is priced at its real shape (:func:`whole_state_bytes`): the same
probe at that shape (no memory; a class that cannot step on ``meta`` — Adafactor reads
``.item()`` — is stepped on two tiny tensors whose state shapes say which dimension each
follows), so classes whose state is not elementwise — Muon (2-D only), Adafactor (row and
column factors) — are priced for what they hold. ``group_optimizers`` gives each param group
its own class (several classes in one ZeRO, e.g. Muon + AdamW).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from zero_lab.partition import ParamSpec, Partition, Partitioner
from zero_lab.state_probe import Expected, expected_state

__all__ = [
    "MemoryPlan",
    "RankMemory",
    "StateRule",
    "plan_memory",
    "probe_state_rule",
    "specs_from_module",
    "whole_state_bytes",
]

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_FIELDS = ("param_bytes", "grad_bytes", "ddp_buffer_bytes", "state_bytes", "master_bytes", "total_bytes")


@dataclass(frozen=True)
class StateRule:
    """Optimizer-state bytes of one stepped tensor of ``numel`` elements.

    ``per_element`` lists ``(state key, bytes per element)`` for entries shaped like the
    tensor; ``fixed`` lists ``(state key, bytes)`` for entries of constant size.
    """

    per_element: tuple[tuple[str, int], ...]
    fixed: tuple[tuple[str, int], ...]

    def nbytes(self, numel: int) -> int:
        return numel * sum(size for _, size in self.per_element) + sum(size for _, size in self.fixed)

    def __str__(self) -> str:
        grows = ", ".join(f"{key} {size} B/elem" for key, size in self.per_element) or "none"
        fixed = ", ".join(f"{key} {size} B" for key, size in self.fixed) or "none"
        return f"per element: {grows}; fixed: {fixed}"


def _state(
    optimizer_class: type[torch.optim.Optimizer], shape: tuple[int, ...], dtype: torch.dtype, defaults: dict[str, Any]
) -> dict[str, Expected]:
    """The tensor state entries ``optimizer_class`` makes for one tensor of ``shape`` (the one probe)."""
    state = expected_state(optimizer_class, defaults, shape, dtype)
    if state is None:
        raise ValueError(
            f"cannot learn the state {optimizer_class.__name__} keeps for a tensor of shape {shape}: it steps "
            "neither on meta tensors nor on tiny ones (e.g. it needs a closure)"
        )
    return {key: entry for key, entry in state.items() if entry.tensor}


def _nbytes(entry: Expected, shape: tuple[int, ...]) -> int:
    """Bytes of one state tensor; one whose shape could not be learnt is priced like the parameter."""
    dims = entry.shape if entry.shape is not None else shape
    itemsize = entry.dtype.itemsize if entry.dtype is not None else 4
    return math.prod(dims) * itemsize


def probe_state_rule(
    optimizer_class: type[torch.optim.Optimizer], dtype: torch.dtype = torch.float32, **defaults: Any
) -> StateRule:
    """The state layout of ``optimizer_class(**defaults)`` for tensors of ``dtype``.

    Asks the class what it makes for a 2- and a 3-element tensor (:func:`expected_state`,
    cached) and sorts each state tensor into "grows with the parameter" or "fixed size".
    """
    small, large = (_state(optimizer_class, (n,), dtype, defaults) for n in (2, 3))
    per_element, fixed = [], []
    for key in sorted(large):
        grows = small.get(key) is not None and small[key].shape == (2,) and large[key].shape == (3,)
        size = _nbytes(large[key], (3,))
        if grows:
            per_element.append((key, size // 3))
        else:
            fixed.append((key, size))
    return StateRule(tuple(per_element), tuple(fixed))


def whole_state_bytes(
    optimizer_class: type[torch.optim.Optimizer],
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    **defaults: Any,
) -> int:
    """State bytes of ``optimizer_class(**defaults)`` for one whole parameter of ``shape``, as
    :func:`expected_state` learns it (one step on a ``meta`` tensor of that shape, cached)."""
    shape = tuple(shape)
    return sum(_nbytes(entry, shape) for entry in _state(optimizer_class, shape, dtype, defaults).values())


def specs_from_module(
    module: nn.Module | Iterable[tuple[str, torch.Tensor]], device: str | torch.device = "cpu"
) -> list[ParamSpec]:
    """One :class:`ParamSpec` per parameter, in ``named_parameters()`` order, one group.

    Works on a model built on the ``meta`` device. ``device`` names where the real run
    keeps its parameters: it is part of each spec's ``kind`` (buffers never mix kinds),
    so it must match the run being predicted, not the meta device.
    """
    named = module.named_parameters() if isinstance(module, nn.Module) else module
    return [ParamSpec.of(param, name=name, device=torch.device(device)) for name, param in named]


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds; see the module docstring for what each field counts."""

    rank: int
    param_bytes: int
    grad_bytes: int
    ddp_buffer_bytes: int
    state_bytes: int
    master_bytes: int
    state_numel: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.ddp_buffer_bytes + self.state_bytes + self.master_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Per-rank memory of one strategy; ``imbalance`` = max / mean of the owned elements.

    ``state_rule`` is the state layout of the first parameter's dtype (for display).
    """

    strategy: str
    world_size: int
    ranks: tuple[RankMemory, ...]
    state_rule: StateRule
    partition: Partition | None = field(default=None, repr=False)

    @property
    def imbalance(self) -> float:
        numel = [r.state_numel for r in self.ranks]
        mean = sum(numel) / len(numel)
        return max(numel) / mean if mean else 1.0

    def summary(self) -> dict[str, dict[str, float]]:
        """``{field: {"max", "mean", "min"}}`` over ranks, for every byte field."""
        out = {}
        for name in _FIELDS:
            values = [getattr(r, name) for r in self.ranks]
            out[name] = {"max": max(values), "mean": sum(values) / len(values), "min": min(values)}
        return out

    def as_dict(self, per_rank: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "strategy": self.strategy,
            "world_size": self.world_size,
            "imbalance": self.imbalance,
            "state_rule": str(self.state_rule),
            "summary": self.summary(),
        }
        if per_rank:
            data["ranks"] = [{name: getattr(r, name) for name in ("rank", *_FIELDS)} for r in self.ranks]
        return data

    def table(self) -> str:
        """Max / mean / min per rank of every field, in MiB."""
        rows = [f"{self.strategy} at W={self.world_size}  (imbalance max/mean {self.imbalance:.4f})"]
        rows.append(f"  {'per rank (MiB)':<18} {'max':>12} {'mean':>12} {'min':>12}")
        for name, stats in self.summary().items():
            label = name.removesuffix("_bytes")
            rows.append(f"  {label:<18} " + " ".join(f"{stats[k] / 2**20:>12.3f}" for k in ("max", "mean", "min")))
        return "\n".join(rows)


def _dtype_of(spec: ParamSpec) -> torch.dtype:
    name = spec.kind.rsplit("/", 1)[-1].removeprefix("torch.")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"cannot read a dtype from ParamSpec.kind {spec.kind!r} (expected 'device/torch.float32')")
    return dtype


def plan_memory(
    specs: Sequence[ParamSpec],
    world_size: int,
    partitioner: Partitioner | None,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
    *,
    master_weights: bool = False,
    gradient_as_bucket_view: bool = False,
    release_grads: bool = False,
    group_optimizers: Sequence[tuple[type[torch.optim.Optimizer], dict[str, Any]]] | None = None,
    **optimizer_defaults: Any,
) -> MemoryPlan:
    """Predict every rank's memory for ``specs`` sharded by ``partitioner`` over ``world_size``.

    ``partitioner=None`` plans plain DDP + the optimizer: every rank holds the state of
    every trainable parameter. Otherwise the partition is the real one
    ``partitioner(specs, world_size)``, and each rank's state is priced shard by shard.
    ``optimizer_defaults`` go to the optimizer (they can change its state: ``amsgrad``,
    ``momentum``). ``group_optimizers[g]`` = ``(class, defaults)`` of param group ``g``
    (``ParamSpec.group``) when groups are stepped by different classes. Whole parameters
    are priced at their shape (:func:`whole_state_bytes`), slices by the per-element rule.
    ``release_grads``: each rank holds, after backward, the gradients of the parameters it owns an
    element of only, and no DDP bucket buffer (released after backward: during backward the
    gradients and DDP's buckets are whole, the peak is DDP's).
    O(number of shards + world_size).
    """
    trainable = [spec for spec in specs if spec.trainable]
    param_bytes = sum(spec.nbytes for spec in specs)
    grad_bytes = sum(spec.nbytes for spec in trainable)
    buckets_freed = gradient_as_bucket_view or (release_grads and partitioner is not None)
    ddp_buffer_bytes = 0 if buckets_freed else grad_bytes

    def stepper(spec: ParamSpec) -> tuple[type[torch.optim.Optimizer], dict[str, Any], torch.dtype]:
        cls, defaults = (optimizer_class, optimizer_defaults)
        if group_optimizers is not None:
            cls, defaults = group_optimizers[spec.group]
        dtype = _dtype_of(spec)
        if master_weights and dtype in _LOW_PRECISION:
            dtype = torch.float32
        return cls, defaults, dtype

    def rule_for(spec: ParamSpec) -> StateRule:
        cls, defaults, dtype = stepper(spec)
        return probe_state_rule(cls, dtype, **defaults)

    def price(spec: ParamSpec, count: int) -> int:
        if count == spec.numel:
            cls, defaults, dtype = stepper(spec)
            return whole_state_bytes(cls, spec.shape, dtype, **defaults)
        return rule_for(spec).nbytes(count)

    state = [0] * world_size
    numel = [0] * world_size
    master = [0] * world_size
    partition = None
    if partitioner is None:
        # Every rank steps every trainable parameter: price rank 0, copy to the others.
        pieces = [(0, spec, spec.numel) for spec in trainable if spec.numel]
        strategy = f"DDP + {optimizer_class.__name__}"
    else:
        partition = partitioner(list(specs), world_size)
        pieces = [
            (shard.rank, partition.specs[shard.param], shard.numel)
            for shard in partition.shards
            if partition.specs[shard.param].trainable and partition.specs[shard.param].gets_grad
        ]
        strategy = f"ZeRO-1 {partitioner!r} + {optimizer_class.__name__}"
    for rank, spec, count in pieces:
        state[rank] += price(spec, count)
        numel[rank] += count
        if master_weights and _dtype_of(spec) in _LOW_PRECISION:
            master[rank] += count * 4
    if partitioner is None:
        state, numel, master = ([values[0]] * world_size for values in (state, numel, master))
    grads = [grad_bytes] * world_size
    if release_grads and partition is not None:
        held: list[set[int]] = [set() for _ in range(world_size)]
        for shard in partition.shards:
            if partition.specs[shard.param].trainable:
                held[shard.rank].add(shard.param)
        grads = [sum(partition.specs[i].nbytes for i in indices) for indices in held]
    ranks = tuple(
        RankMemory(r, param_bytes, grads[r], ddp_buffer_bytes, state[r], master[r], numel[r]) for r in range(world_size)
    )
    try:
        rule = rule_for(specs[0]) if specs else probe_state_rule(optimizer_class, **optimizer_defaults)
    except (ValueError, RuntimeError):  # a class that steps no 1-D tensor (Muon): no per-element rule to show
        rule = StateRule((), ())
    return MemoryPlan(strategy, world_size, ranks, rule, partition)
