"""What the app asks of a model and of a data source, written down and checked before start.

**A model** is a ``torch.nn.Module`` built from ``model._target_`` (its constructor's arguments
are the ``model.`` keys), with

* ``task: str`` — a class attribute naming the kind of batches it trains on; its data must
  declare the same ``task``. The shipped data options declare ``"regression"``
  (``data=synthetic``: float rows, MSE), ``"lm"`` (``data=tokens``, ``data=text``: token ids,
  next-token cross-entropy) and ``"image"`` (``data=images``: ``(N, C, H, W)`` floats, class
  labels, cross-entropy); any other name pairs a model with data of yours. A ``transformers``
  class has no ``task``: :func:`task_of` takes it from ``transformers``' own task tables
  (:data:`TRANSFORMERS_TASKS`: a causal LM is ``"lm"``, an image classifier ``"image"``), so
  ``model._target_: transformers.GPT2LMHeadModel`` with a ``config`` node trains as it is;
* ``forward(inputs)`` — or ``forward(**inputs)`` when the data's inputs are a mapping of
  tensors (``{"input_ids": ..., "labels": ...}``) — returning either
  - a tensor: the output the data's ``loss`` reads, or
  - a mapping or a ``transformers`` ``ModelOutput``: the data's ``loss`` reads
    ``output[output_key]`` (the top-level key ``output_key``, ``logits`` by default); a data
    source without ``loss`` takes the model's own ``output["loss"]``.

**A data source** is built from ``data._target_``, declares the same ``task`` and
``global_batch: int`` (rows per optimizer step over all ranks), and offers one of

* :class:`GlobalBatchData` — ``shard(step, rank, world_size) -> (inputs, targets)``: this
  rank's slice of step ``step``'s global batch, a pure function of ``(seed, step)``: every
  world size then follows the same trajectory (``zero_lab.app.workloads.data``);
* :class:`RankStreamData` — ``batches(rank, world_size, start_step) -> Iterator[(inputs,
  targets)]``: an iterable sharded by rank (each rank reads its own ``global_batch /
  world_size`` rows per step), started at ``start_step`` when a run resumes;

and optionally ``loss(output, targets) -> scalar tensor`` (else the model's own loss) and
``val_shard(index, rank, world_size)``: held-out batches for the validation loss
(``eval_every``). Inputs and targets are tensors (or, for inputs, a mapping of tensors).

:func:`protocol_problems` checks the classes (a missing ``task``, ``shard``/``batches``), and
:func:`forward_problems` runs the model's forward and the loss on ``meta`` tensors shaped as a
real batch, before any rank starts; the runner calls the same :func:`call_model`,
:func:`loss_of` and :func:`batch_stream`.

    output = call_model(ddp, inputs)
    loss = loss_of(output, targets, data, output_key="logits")
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = [
    "OUTPUT_KEY",
    "Batch",
    "GlobalBatchData",
    "Inputs",
    "ProtocolError",
    "RankStreamData",
    "TrainableModel",
    "batch_rows",
    "batch_stream",
    "call_model",
    "embedding_rows",
    "forward_problems",
    "loss_of",
    "protocol_problems",
    "select_output",
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


def select_output(output: Any, key: str) -> torch.Tensor:
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
        return data.loss(select_output(output, output_key).float(), targets)
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
        step = start_step
        while True:
            yield data.shard(step, rank, world_size)
            step += 1
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
    for name, cls, task, other in (
        (model_name, model_cls, model_task, data_task),
        (data_name, data_cls, data_task, model_task),
    ):
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


def forward_problems(
    model: nn.Module,
    data: Any,
    world_size: int,
    output_key: str,
    float_dtype: torch.dtype | None = None,
    find_unused_parameters: bool = False,
) -> list[str]:
    """Run rank 0's first batch through ``model`` (built on ``meta``) and the loss, on meta tensors.

    Finds, before any rank starts, a forward that returns something the loss cannot read (a
    dict without ``output_key``), a data source whose batch the model cannot take, a loss that
    is not a scalar, and (backward on meta too) parameters the forward leaves unused, which
    DDP refuses unless ``dist.find_unused_parameters=true`` (or ``dist.static_graph=true``). A
    model whose forward cannot run on meta tensors at all (data-dependent Python control flow)
    is not judged here.
    """
    try:
        inputs, targets = next(batch_stream(data, 0, world_size, 0))
    except Exception as error:  # user code: the data source's; reported with its key (data:)
        return [f"data: reading the first batch failed: {type(error).__name__}: {_first_line(error)}"]
    meta_inputs = to_device(inputs, torch.device("meta"), float_dtype)
    meta_targets = targets.to("meta") if torch.is_tensor(targets) else targets
    try:
        output = call_model(model, meta_inputs)
    except NotImplementedError:  # an op without a meta kernel: cannot be judged here
        return []
    except Exception as error:  # user code: the model's forward; reported with its key (model:)
        if "meta" in str(error).lower():
            return []
        return [f"model: its forward fails on the data's first batch: {type(error).__name__}: {_first_line(error)}"]
    try:
        loss = loss_of(output, meta_targets, data, output_key)
    except ProtocolError as error:
        return [str(error)]
    except Exception as error:  # user code: the data source's loss; reported with its key (data:)
        if "meta" in str(error).lower():
            return []
        return [f"data: its loss fails on the model's output: {type(error).__name__}: {_first_line(error)}"]
    if not torch.is_tensor(loss) or loss.numel() != 1:
        shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
        return [f"data: its loss must be a scalar tensor; it returned {shape} ({DOC})"]
    if find_unused_parameters:
        return []
    try:
        loss.backward()
    except (NotImplementedError, RuntimeError):  # a backward without meta kernels: cannot be judged here
        return []
    except Exception as error:  # user code: the model's own backward (a custom autograd.Function); reported
        return [f"model: its backward fails on the data's first batch: {type(error).__name__}: {_first_line(error)}"]
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if unused:
        shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
        return [
            f"model: its forward leaves {len(unused)} parameter(s) unused ({shown}), which DDP refuses after the "
            "first step; set dist.find_unused_parameters=true (or dist.static_graph=true), or freeze them "
            "(requires_grad=False)"
        ]
    return []


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
