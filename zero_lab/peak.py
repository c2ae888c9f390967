"""The peak of a training step, planned: what :func:`zero_lab.planner.plan_memory` holds, plus what
lives only for a moment.

``plan_memory`` prices the tensors a rank keeps from step to step (gradients, DDP's buckets, the
optimizer's state). A rank's peak resident memory is higher by what exists only inside a phase of
the step; each term here is derived from the model, its layout and the batch, not fitted:

* ``activations`` — the tensors autograd saves for backward (:func:`saved_activation_bytes`: the
  forward and loss run once with ``saved_tensors_hooks`` counting every saved storage that is not a
  parameter's; on a ``meta`` model it allocates nothing). They live until backward frees them.
* ``produced_grad`` — the gradient autograd has just produced for a parameter, before it reaches
  its bucket (DDP copies it into its bucket, the engine into its bucket buffer, and then frees it):
  the largest trainable parameter's bytes, alive one at a time.
* ``receive`` — communication buffers the gradient phase allocates: the engine's point-to-point
  reduce-scatter (:class:`zero_lab.grad_reduce.P2PReduceScatter`) receives each peer's copy of this
  rank's range of a bucket, for each of the (at most two) buckets in flight:
  ``2 · (W − 1) · largest owned range``. DDP's all-reduce and the ZeRO exchange's broadcasts run in
  place (0), and so does the engine over host shared memory, which adds the peers' slots in place;
* ``mailboxes`` — the engine over host shared memory (:mod:`zero_lab.host_shm`) holds, for the whole
  step, the pages of the mailboxes it touched: its own (written) and what it read of its peers'. At
  W = 2 it reads all of the peer's slot (the peer's message is this rank's segment, or the peer's
  range); from W = 3 a message holds one piece per reader, so each peer's slots are read in two
  places (this rank's piece of a reduce-scatter, the peer's range of an all-gather):
  ``(1 + min(W − 1, 2)) · mailbox``, counted with ``held`` in both phases;
* ``step_workspace`` — the optimizer's temporaries during ``step()``: torch's single-tensor
  implementations step one tensor at a time, so ``workspace per byte`` (:func:`step_workspace_ratio`:
  the second step of the real class on a 4096-element tensor, under a ``TorchFunctionMode`` that
  counts, while it is alive, every torch call's output that aliases neither an input nor the
  parameter, its gradient or its state — Adam: ``exp_avg_sq.sqrt()`` and its quotient, 2 × the
  tensor) times the largest tensor this rank steps (a whole parameter on DDP
  and ZeRO-1, an owned bucket range on the engine).

The phases do not overlap: the backward peak is ``held + activations + produced_grad + receive``,
the step's ``held + step_workspace``, and the plan is the larger (:class:`PeakPlan`). What this does
not count, by design: the interpreter's and libraries' code pages first executed during training,
and memory the C allocator keeps after a tensor is freed (glibc keeps up to twice its largest freed
block, run-dependent) — ``scripts/bench_memory.py`` warms the first and pins the second
(``MALLOC_MMAP_THRESHOLD_``) so that it measures what the tensors take.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from zero_lab.engine.layout import Bucket, grad_hold_bound
from zero_lab.engine.wrapper import mailbox_bytes
from zero_lab.partition import ParamSpec
from zero_lab.planner import MemoryPlan

__all__ = [
    "GRAD_REDUCTIONS",
    "PeakPlan",
    "engine_peak",
    "peak_of_plan",
    "saved_activation_bytes",
    "step_workspace_ratio",
]

#: The engine's gradient reductions the plan prices (:func:`engine_peak`).
GRAD_REDUCTIONS = ("shm_reduce_scatter", "reduce_scatter", "all_reduce")
_PROBE_NUMEL = 4096


@dataclass(frozen=True)
class PeakPlan:
    """One rank's planned peak of what training adds, in bytes, by term (see the module docstring)."""

    held: int
    activations: int
    produced_grad: int
    receive: int
    step_workspace: int

    @property
    def backward_peak(self) -> int:
        return self.held + self.activations + self.produced_grad + self.receive

    @property
    def step_peak(self) -> int:
        return self.held + self.step_workspace

    @property
    def total(self) -> int:
        return max(self.backward_peak, self.step_peak)


def saved_activation_bytes(run: Callable[[], Any], params: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` (forward + loss)
    runs, parameters' storages excluded. With a model and inputs on ``meta`` nothing is allocated."""
    # a storage's Python object is unique and preserved (``t.untyped_storage() is t.view(-1).untyped_storage()``);
    # the objects are held here, so their ids stay theirs
    excluded = {id(storage): storage for storage in (param.untyped_storage() for param in params)}
    saved: dict[int, tuple[torch.UntypedStorage, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if id(storage) not in excluded:
            saved[id(storage)] = (storage, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(nbytes for _, nbytes in saved.values())


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


class _LiveBytes(TorchFunctionMode):
    """Counts the bytes of torch calls' outputs that alias neither an input nor an ``existing`` tensor
    (an attribute read such as ``param.grad`` is a call too) while they are alive, and their peak."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        super().__init__()
        self.existing = {id(storage): storage for storage in (t.untyped_storage() for t in existing)}
        self.live = 0
        self.peak = 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in _tensors((args, kwargs))}
        for tensor in _tensors(out):
            storage = tensor.untyped_storage()
            if id(storage) not in inputs and id(storage) not in self.existing:
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(tensor, self._freed, storage.nbytes())
        return out


@functools.cache
def _workspace_ratio(optimizer_class: type[torch.optim.Optimizer], dtype: torch.dtype, defaults: tuple) -> float:
    param = torch.nn.Parameter(torch.ones(_PROBE_NUMEL, dtype=dtype))
    optimizer = optimizer_class([param], **dict(defaults))
    param.grad = torch.full_like(param, 1e-3)
    optimizer.step()  # the first step makes the state; the second's new tensors are only temporaries
    state = [value for value in optimizer.state[param].values() if isinstance(value, torch.Tensor)]
    with _LiveBytes([param, param.grad, *state]) as counter:
        optimizer.step()
    return counter.peak / (_PROBE_NUMEL * param.element_size())


def step_workspace_ratio(
    optimizer_class: type[torch.optim.Optimizer], dtype: torch.dtype = torch.float32, **defaults: Any
) -> float:
    """Peak temporary bytes of one ``optimizer_class(**defaults)`` step per byte of the tensor stepped
    (measured on a CPU tensor of 4096 elements at its second step; cached). Adam: 2.0; SGD: 0.0."""
    defaults = {"lr": 1e-3} | defaults
    return _workspace_ratio(optimizer_class, dtype, tuple(sorted(defaults.items())))


def peak_of_plan(
    plan: MemoryPlan,
    specs: Sequence[ParamSpec],
    activations: int,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
    **optimizer_defaults: Any,
) -> list[PeakPlan]:
    """Per rank: DDP (``plan.partition is None``) or ZeRO-1 on DDP (whole parameters stepped by their
    owners, ``SortedGreedy``), exchange and all-reduce in place."""
    ratio = step_workspace_ratio(optimizer_class, **optimizer_defaults)
    trainable = [i for i, spec in enumerate(specs) if spec.trainable]
    produced = max((specs[i].nbytes for i in trainable), default=0)
    if plan.partition is None:
        stepped = [produced] * plan.world_size
    else:
        owners = plan.partition.owners()
        stepped = [
            max((specs[i].nbytes for i in trainable if owners[i] == r), default=0) for r in range(plan.world_size)
        ]
    return [
        PeakPlan(
            rank.grad_bytes + rank.ddp_buffer_bytes + rank.state_bytes,
            activations,
            produced,
            0,
            round(ratio * stepped[rank.rank]),
        )
        for rank in plan.ranks
    ]


def engine_peak(
    plan: MemoryPlan,
    specs: Sequence[ParamSpec],
    buckets: Sequence[Bucket],
    activations: int,
    grad_reduce: str = "reduce_scatter",
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
    **optimizer_defaults: Any,
) -> list[PeakPlan]:
    """Per rank of :class:`zero_lab.ShardedDataParallel` with ``buckets``: its state (``plan``, whose
    partition must be the engine's), the gradient bound of its layout, and the transient terms.
    ``grad_reduce``: ``shm_reduce_scatter`` (through host shared memory: the engine's default on one
    x86-64 host), ``reduce_scatter`` (point-to-point over Gloo) or ``all_reduce`` (in place)."""
    if grad_reduce not in GRAD_REDUCTIONS:
        raise ValueError(f"grad_reduce={grad_reduce!r}: the plan knows {', '.join(map(repr, GRAD_REDUCTIONS))}")
    ratio = step_workspace_ratio(optimizer_class, **optimizer_defaults)
    produced = max((spec.nbytes for spec in specs if spec.trainable), default=0)
    world = plan.world_size
    peers = world - 1 if grad_reduce == "reduce_scatter" else 0
    mailboxes = 0
    if grad_reduce == "shm_reduce_scatter" and world > 1:
        mailboxes = (1 + min(world - 1, 2)) * mailbox_bytes(buckets, world)
    out = []
    for rank in plan.ranks:
        ranges = [bucket.owned_numel(rank.rank) * bucket.itemsize for bucket in buckets]
        largest = max(ranges, default=0)
        held = rank.state_bytes + grad_hold_bound(buckets, rank.rank) + mailboxes
        out.append(PeakPlan(held, activations, produced, 2 * peers * largest, round(ratio * largest)))
    return out
