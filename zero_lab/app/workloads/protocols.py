"""What the app asks of a model and of a data source, written down and checked before start.

**A model** is a ``torch.nn.Module`` built from ``model._target_`` (:class:`TrainableModel`): a
``task`` class attribute naming the kind of batches it trains on, the same as its data's (the
shipped data: ``"regression"``, ``"lm"``, ``"image"``; a ``transformers`` class takes it from
``transformers``' task tables, :func:`task_of`), and a ``forward(inputs)`` (``forward(**inputs)``
for a mapping of tensors) returning a tensor, or a mapping / ``ModelOutput`` whose
``output[output_key]`` the data's loss reads (``logits`` by default).

**A data source** built from ``data._target_`` declares the same ``task`` and ``global_batch``
(rows per optimizer step over all ranks) and reads batches as :class:`GlobalBatchData` (a pure
function of ``(seed, step)``: every world size follows the same trajectory) or as
:class:`RankStreamData`; optionally ``loss(output, targets)`` (else the model's own
``output["loss"]``) and ``val_shard(index, rank, world_size)`` for ``eval_every``.

:func:`protocol_problems` checks the classes; :func:`probe_on_meta` runs rank 0's first batch
through the forward, the loss and backward on ``meta`` tensors before any rank starts. The
runner calls the same :func:`call_model`, :func:`loss_of` and :func:`batch_stream`.

    output = call_model(ddp, inputs)
    loss = loss_of(output, targets, data, output_key="logits")
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from zero_lab.app.workloads.user_code import attempt, first_line

__all__ = [
    "OUTPUT_KEY",
    "Batch",
    "GlobalBatchData",
    "Inputs",
    "MetaProbe",
    "ProtocolError",
    "RankStreamData",
    "TrainableModel",
    "batch_rows",
    "batch_stream",
    "call_model",
    "embedding_rows",
    "forward_problems",
    "loss_of",
    "probe_on_meta",
    "protocol_problems",
    "task_of",
    "to_device",
]

Inputs = torch.Tensor | Mapping[str, torch.Tensor]
Batch = tuple[Inputs, torch.Tensor | None]

DOC = "zero_lab/app/workloads/protocols.py"
#: The default ``output_key``: the entry of a mapping or ``transformers`` ``ModelOutput`` the loss reads.
OUTPUT_KEY = "logits"


class ProtocolError(TypeError):
    """A model or data source that does not follow the protocol; the message says what to add."""


#: ``transformers``' auto-class tables (``modeling_auto.<table>``) whose classes get a ``task``:
#: the tables of heads whose ``logits`` the shipped data's losses read as they are.
TRANSFORMERS_TASKS: dict[str, str] = {
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "lm",  # logits (N, T, vocab): next-token cross-entropy
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "image",  # logits (N, classes) from pixel_values
}


def task_of(model_cls: Any) -> str | None:
    """The model class's ``task``: its attribute, else (a ``transformers`` class) the task of the
    auto-class table that lists it (:data:`TRANSFORMERS_TASKS`); ``None`` when neither says."""
    task = getattr(model_cls, "task", None)
    if task is not None or not str(getattr(model_cls, "__module__", "")).startswith("transformers."):
        return task
    from transformers.models.auto import modeling_auto  # already imported with the class

    name = model_cls.__name__
    for table, table_task in TRANSFORMERS_TASKS.items():
        for value in getattr(modeling_auto, table, {}).values():
            if name == value or (isinstance(value, tuple) and name in value):
                return table_task
    return None


@runtime_checkable
class TrainableModel(Protocol):
    """A ``torch.nn.Module`` with a ``task``; ``forward`` returns a tensor, a mapping or a ModelOutput."""

    task: str

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor | Mapping[str, Any]: ...


@runtime_checkable
class GlobalBatchData(Protocol):
    """One global batch per step from ``(seed, step)``, sliced for ``rank`` of ``world_size``."""

    task: str
    global_batch: int

    def shard(self, step: int, rank: int, world_size: int) -> Batch: ...


@runtime_checkable
class RankStreamData(Protocol):
    """An iterable sharded by rank: ``global_batch / world_size`` rows per step on every rank."""

    task: str
    global_batch: int

    def batches(self, rank: int, world_size: int, start_step: int) -> Iterator[Batch]: ...


def call_model(model: nn.Module, inputs: Inputs) -> Any:
    """``model(**inputs)`` for a mapping of tensors, else ``model(inputs)``."""
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)


def _select_output(output: Any, key: str) -> torch.Tensor:
    """The tensor the loss reads: ``output`` itself, or ``output[key]`` of a mapping / ModelOutput."""
    if torch.is_tensor(output):
        return output
    if isinstance(output, Mapping):
        value = output.get(key)
        if torch.is_tensor(value):
            return value
        found = ", ".join(str(k) for k, v in output.items() if torch.is_tensor(v))
        raise ProtocolError(
            f"output_key={key}: the model's forward returned a {type(output).__name__} without a tensor "
            f"{key!r} (it has: {found}); set output_key=<one of those> ({DOC})"
        )
    raise ProtocolError(
        f"the model's forward returned a {type(output).__name__}; return a tensor, a mapping of tensors or a "
        f"transformers ModelOutput ({DOC})"
    )


def loss_of(output: Any, targets: torch.Tensor | None, data: Any, output_key: str = OUTPUT_KEY) -> torch.Tensor:
    """The step's loss in fp32: ``data.loss(output[output_key], targets)``, or the model's own
    ``output["loss"]`` when the data has no ``loss``."""
    if callable(getattr(data, "loss", None)):
        return data.loss(_select_output(output, output_key).float(), targets)
    own = output.get("loss") if isinstance(output, Mapping) else None
    if not torch.is_tensor(own):
        raise ProtocolError(
            f"{type(data).__name__} has no loss(output, targets) and the model's forward returned no 'loss': "
            f"add a loss method to the data, or return {{'loss': ...}} (a transformers model does when given "
            f"labels) ({DOC})"
        )
    return own.float()


def batch_stream(data: Any, rank: int, world_size: int, start_step: int) -> Iterator[Batch]:
    """This rank's batches from ``start_step`` on, whichever data protocol ``data`` follows."""
    if callable(getattr(data, "shard", None)):
        yield from (data.shard(step, rank, world_size) for step in itertools.count(start_step))
    yield from data.batches(rank, world_size, start_step)


def to_device(inputs: Inputs, device: torch.device, float_dtype: torch.dtype | None = None) -> Inputs:
    """Move inputs (a tensor or a mapping of them) to ``device``; floating ones to ``float_dtype``."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(device)
        return tensor.to(float_dtype) if float_dtype is not None and tensor.is_floating_point() else tensor

    return {k: move(v) for k, v in inputs.items()} if isinstance(inputs, Mapping) else move(inputs)


def batch_rows(inputs: Inputs) -> int:
    """Rows (samples) in a batch of inputs."""
    first = next(iter(inputs.values())) if isinstance(inputs, Mapping) else inputs
    return int(first.shape[0])


def protocol_problems(
    model_cls: Any, data_cls: Any, model_name: str, data_name: str, fitting: Sequence[str] = ()
) -> list[str]:
    """What the classes lack: ``task`` on either side (or a mismatch), and a data method to read
    batches. ``fitting``: the data options a mismatch can pick instead (``data=tokens``)."""
    out = []
    model_task, data_task = task_of(model_cls), getattr(data_cls, "task", None)
    sides = ((model_name, model_cls, model_task, data_task), (data_name, data_cls, data_task, model_task))
    for name, cls, task, other in sides:
        if not isinstance(task, str):
            example = other if isinstance(other, str) else "regression"
            how = f"add the class attribute `task = {example!r}`"
            if str(getattr(cls, "__module__", "")).startswith("transformers."):  # cannot be edited: subclassed
                how = (
                    f"it is in none of transformers' tables of causal LMs or image classifiers; subclass it "
                    f"with `task = {example!r}` and name the subclass in _target_"
                )
            out.append(
                f"{name}: {getattr(cls, '__qualname__', cls)} has no `task` attribute; {how} (the same on the model "
                f"and its data; {DOC})"
            )
    if not out and model_task != data_task:
        out.append(
            f"{data_name}: {model_name} is a {model_task!r} model and needs data for that task, but this data's "
            f"task is {data_task!r} ({'pick ' + ' or '.join(fitting) + '; ' if fitting else ''}{DOC})"
        )
    if not (callable(getattr(data_cls, "shard", None)) or callable(getattr(data_cls, "batches", None))):
        out.append(
            f"{data_name}: {getattr(data_cls, '__qualname__', data_cls)} offers neither shard(step, rank, world_size) "
            f"nor batches(rank, world_size, start_step); add one of them ({DOC})"
        )
    return out


def embedding_rows(model: nn.Module) -> int | None:
    """Rows of the model's input embedding (the token ids it can look up): ``transformers``'
    ``get_input_embeddings()``, else the first ``nn.Embedding``; ``None`` without one. A data
    source that declares ``vocab_size`` must fit in it (ids ``0 … vocab_size - 1``)."""
    getter = getattr(model, "get_input_embeddings", None)
    found = getter() if callable(getter) else None
    if not isinstance(found, nn.Embedding):
        found = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return None if found is None else int(found.num_embeddings)


class _MetaLimit(Exception):
    """The forward read a tensor's values (``.item()``, ``if tensor:``, ...), which meta tensors do not have."""


class _NoValuesOnMeta(TorchFunctionMode):
    """Raises :class:`_MetaLimit` where code reads a tensor's values (torch's own error for it is a
    plain ``RuntimeError``, which cannot be told from the model's own)."""

    READS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__"})

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", None) in self.READS:
            raise _MetaLimit(f"{func.__name__} reads a tensor's values")
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class MetaProbe:
    """What rank 0's first batch did on the model built on ``meta``: the problems found (one line
    each, prefixed with the key of the code at fault) and the trainable parameters backward left
    without a gradient (``None``: the meta device could not run that far, nothing judged)."""

    problems: list[str]
    unused: list[str] | None


def probe_on_meta(
    model: nn.Module, data: Any, world_size: int, output_key: str, float_dtype: torch.dtype | None = None
) -> MetaProbe:
    """Run rank 0's first batch through ``model`` (built on ``meta``: no memory, no arithmetic), the
    loss and backward, on meta tensors, and clear the gradients again. Code the meta device cannot
    run (decided by the error's type: an op without a meta kernel, a read of values) is not judged."""
    read = attempt(lambda: next(batch_stream(data, 0, world_size, 0)))
    if read.error is not None:
        return MetaProbe([f"data: reading the first batch failed: {first_line(read.error)}"], None)
    inputs, targets = read.value  # type: ignore[misc]
    meta_targets = targets.to("meta") if torch.is_tensor(targets) else targets
    try:
        with torch.device("meta"), _NoValuesOnMeta():  # tensors the forward makes itself are meta too
            return _forward_backward(model, to_device(inputs, torch.device("meta"), float_dtype), meta_targets, data,
                                     output_key)  # fmt: skip
    finally:
        for param in model.parameters():
            param.grad = None  # the plan's model stays as its other readers found it


def _failed(error: Exception, what: str) -> MetaProbe:
    """``what`` failed with ``error``: one problem, or none when only the meta device could not run
    it (an op without a meta kernel, a read of values)."""
    cannot_judge = isinstance(error, (NotImplementedError, _MetaLimit))
    return MetaProbe([] if cannot_judge else [f"{what}: {first_line(error)}"], None)


def _forward_backward(model: nn.Module, inputs: Inputs, targets: Any, data: Any, output_key: str) -> MetaProbe:
    output = attempt(lambda: call_model(model, inputs))
    if output.error is not None:
        return _failed(output.error, "model: its forward fails on the data's first batch")
    loss = attempt(lambda: loss_of(output.value, targets, data, output_key))
    if isinstance(loss.error, ProtocolError):
        return MetaProbe([str(loss.error)], None)
    if loss.error is not None:
        return _failed(loss.error, "data: its loss fails on the model's output")
    value = loss.value
    if not torch.is_tensor(value) or value.numel() != 1:
        shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
        return MetaProbe([f"data: its loss must be a scalar tensor; it returned {shape} ({DOC})"], None)
    backward = attempt(value.backward)
    if isinstance(backward.error, RuntimeError):  # torch's backward kernels on meta: not judged
        return MetaProbe([], None)
    if backward.error is not None:  # the model's own backward (a custom autograd.Function)
        return _failed(backward.error, "model: its backward fails on the data's first batch")
    return MetaProbe([], [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None])


def forward_problems(probe: MetaProbe, find_unused_parameters: bool = False) -> list[str]:
    """The pre-start check's reading of a :func:`probe_on_meta`: its problems, and parameters the
    forward leaves unused, which DDP refuses unless ``dist.find_unused_parameters=true`` (or
    ``dist.static_graph=true``: ``find_unused_parameters``)."""
    if probe.problems or find_unused_parameters or not probe.unused:
        return probe.problems
    unused = probe.unused
    shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
    return [
        f"model: its forward leaves {len(unused)} parameter(s) unused ({shown}), which DDP refuses after the "
        "first step; set dist.find_unused_parameters=true (or dist.static_graph=true), or freeze them "
        "(requires_grad=False)"
    ]
