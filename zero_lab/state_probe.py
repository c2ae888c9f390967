"""Ask an optimizer class itself: its required arguments, its defaults, the state it makes for a
tensor — the one "build it (and step it once) on ``meta`` tensors" probe of the package — and
whether a saved state fits.

Every caller that needs to know what a class does asks here: :mod:`zero_lab.chained` builds a
class with :func:`required_args` and learns a group's defaults with :func:`group_defaults`;
:mod:`zero_lab.planner` prices state with :func:`expected_state`; :mod:`zero_lab.checkpoint`
checks a loaded state with :func:`expected_state` and :func:`state_problem`.

A loaded checkpoint's state is trusted only as far as it looks like what the class would
have made: ``momentum_buffer`` of 95 × 32 for a 96 × 32 matrix fails deep inside Muon's
step, naming nothing, and a shard whose ``momentum_buffer`` was deleted resumes silently
with fresh momentum. No hand-kept table says what each class holds; :func:`expected_state`
asks the class:

1. build it over one ``meta`` tensor of the real shape and dtype (no memory, no arithmetic),
   with the group's hyper-parameters (those that pick a code path but not the state —
   ``foreach``, ``fused``, ``capturable``, ``differentiable`` — left out, so a CUDA-only
   path is not needed to learn the state), give the tensor a ``meta`` gradient and ``step()``
   once: the state it made is the answer, each tensor's shape and dtype exact;
2. a class that cannot step on ``meta`` (it reads a value with ``.item()``: Adafactor,
   ASGD) steps instead on two tiny real tensors of the same rank whose sizes are distinct
   primes (2, 3, 5, … and 3, 5, 7, …): a state dimension that follows parameter dimension
   ``k`` in both probes stands for the real dimension ``k``, one equal in both is fixed,
   anything else is left unchecked (the key and dtype still are);
3. a class that steps on neither (LBFGS needs a closure) is not checked.

:func:`state_problem` compares a saved state with that answer: every key the class makes
is present (extra keys are kept, as ``load_state_dict`` keeps them: a class may add state
after its first step), every tensor has the expected shape, and a dtype of the same kind
(floating state may differ in precision: ``load_state_dict`` casts it to the parameter's).
Answers are cached per (class, hyper-parameters, shape, dtype).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["Expected", "expected_state", "group_defaults", "required_args", "state_problem"]

log = logging.getLogger(__name__)

#: Param-group keys that pick a code path, not what state is kept; left out of the probe.
PATH_KEYS = ("foreach", "fused", "capturable", "differentiable")
#: A key LR schedulers add to a param group that is no argument of the class. The callers pass
#: hyper-parameters only (without the keys of :data:`zero_lab.chained.NOT_HYPERPARAMETERS`).
NOT_ARGUMENTS = ("initial_lr",)
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31)


@dataclass(frozen=True)
class Expected:
    """One state entry a class makes: a tensor (``shape``: the expected shape, ``None`` where
    it could not be learnt) of ``dtype``, or a plain value (``tensor=False``)."""

    tensor: bool
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None


_cache: dict[tuple[Any, ...], dict[str, Expected] | None] = {}


def expected_state(
    cls: type[Optimizer], hyper: Mapping[str, Any], shape: Sequence[int], dtype: torch.dtype
) -> dict[str, Expected] | None:
    """The state ``cls`` keeps for a tensor of ``shape`` and ``dtype`` stepped with the group
    hyper-parameters ``hyper`` (see the module docstring); ``None`` when it cannot be learnt."""
    arguments = {k: v for k, v in hyper.items() if k not in PATH_KEYS and k not in NOT_ARGUMENTS}
    key = (cls, repr(sorted(arguments.items(), key=lambda item: item[0])), tuple(shape), dtype)
    if key not in _cache:
        _cache[key] = _learn(cls, arguments, tuple(shape), dtype)
    return _cache[key]


def required_args(cls: type[Optimizer], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of ``cls`` without a default, taken from ``arguments`` (those it
    lacks are left out, so the constructor names them)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    try:
        parameters = inspect.signature(cls).parameters.items()
    except (TypeError, ValueError):
        return {}
    return {
        name: arguments[name]
        for name, p in parameters
        if name != "params" and p.kind in kinds and p.default is inspect.Parameter.empty and name in arguments
    }


def _built(cls: type[Optimizer], arguments: Mapping[str, Any], tensor: torch.Tensor) -> Optimizer:
    """``cls`` over one parameter, ``tensor``, as one group of ``arguments``."""
    return cls([{"params": [tensor], **arguments}], **required_args(cls, arguments))


def group_defaults(
    cls: type[Optimizer], hyper: Mapping[str, Any], shape: Sequence[int], dtype: torch.dtype
) -> dict[str, Any]:
    """Every key ``cls`` gives a param group of ``hyper`` (its own keys, then the class's defaults),
    learnt by building the class over a ``meta`` tensor of ``shape`` (no memory), so a class that
    checks shapes at construction (Muon: 2-D only) checks this one; its errors propagate."""
    built = _built(cls, hyper, torch.empty(tuple(shape), dtype=dtype, device="meta"))
    return {k: v for k, v in built.param_groups[0].items() if k != "params"}


def _one_step(cls: type[Optimizer], arguments: dict[str, Any], tensor: torch.Tensor) -> dict[str, Any]:
    param = torch.nn.Parameter(tensor)
    param.grad = torch.zeros_like(tensor)
    optimizer = _built(cls, arguments, param)
    optimizer.step()
    return dict(optimizer.state[param])


def _learn(
    cls: type[Optimizer], arguments: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype
) -> dict[str, Expected] | None:
    try:
        state = _one_step(cls, arguments, torch.empty(shape, dtype=dtype, device="meta"))
        return {key: _as_expected(value) for key, value in state.items()}
    except Exception as error:  # a class that cannot step on meta: try tiny tensors
        log.debug("%s cannot step on meta tensors (%s); probing tiny ones", cls.__name__, error)
    if len(shape) >= len(_PRIMES):
        return None
    tiny = [tuple(_PRIMES[i + offset] for i in range(len(shape))) for offset in (0, 1)]
    try:
        first, second = (_one_step(cls, arguments, torch.zeros(size, dtype=dtype)) for size in tiny)
    except Exception as error:  # e.g. a class that needs a closure: nothing to learn
        log.debug("%s cannot step on tiny tensors either (%s); its state is not checked", cls.__name__, error)
        return None
    out = {}
    for key, value in first.items():
        other = second.get(key)
        if not torch.is_tensor(value):
            out[key] = Expected(False)
            continue
        out[key] = Expected(True, _real_shape(value.shape, getattr(other, "shape", None), tiny, shape), value.dtype)
    return out


def _as_expected(value: Any) -> Expected:
    return Expected(True, tuple(value.shape), value.dtype) if torch.is_tensor(value) else Expected(False)


def _real_shape(
    a: Sequence[int], b: Sequence[int] | None, tiny: list[tuple[int, ...]], real: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The real shape of a state tensor seen as ``a`` and ``b`` in the two tiny probes."""
    if b is None or len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
            continue
        follows = [k for k in range(len(real)) if (tiny[0][k], tiny[1][k]) == (x, y)]
        if not follows:
            return None
        out.append(real[follows[0]])
    return tuple(out)


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "floating"
    if dtype.is_complex:
        return "complex"
    return str(dtype)


def state_problem(saved: Mapping[str, Any], expected: Mapping[str, Expected], class_name: str) -> str | None:
    """What is wrong with a saved state given what the class makes (the first problem, in words
    naming the key), or ``None`` when it fits."""
    missing = [key for key in expected if key not in saved]
    if missing:
        return (
            f"lacks the state {', '.join(repr(k) for k in missing)} that {class_name} keeps "
            f"(it holds {sorted(saved) or 'nothing'})"
        )
    for key, want in expected.items():
        value = saved[key]
        if not want.tensor:
            continue
        if not torch.is_tensor(value):
            return f"holds {key!r} as a {type(value).__name__}, where {class_name} keeps a tensor"
        if want.shape is not None and tuple(value.shape) != want.shape:
            return f"holds {key!r} of shape {tuple(value.shape)}, where {class_name} keeps {want.shape}"
        if want.dtype is not None and _kind(value.dtype) != _kind(want.dtype):
            return f"holds {key!r} of dtype {value.dtype}, where {class_name} keeps {want.dtype}"
    return None
