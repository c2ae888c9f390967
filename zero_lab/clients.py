"""Glue for training loops that build the optimizer themselves (docs/clients.md).

HF Trainer, accelerate and Lightning take a ``ZeroRedundancyOptimizer`` as it is. torchtitan
builds its optimizers by name inside ``OptimizersContainer`` (``_resolve_optimizer_factory``
maps ``"AdamW"`` to ``torch.optim.AdamW``); :func:`zero_factory` wraps that mapping so each
name builds a ZeRO optimizer of the same class, with the same groups and keyword
arguments. The two-line recipe::

    class ZeroOptimizersContainer(OptimizersContainer):
        _resolve_optimizer_factory = staticmethod(zero_factory(OptimizersContainer._resolve_optimizer_factory))

torchtitan's parameters must be plain tensors here (zero_lab refuses DTensors, see
:mod:`zero_lab.dtensors`): wrap the model in DDP and pass it as the container's model part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer

from zero_lab.optimizer import ZeroRedundancyOptimizer

__all__ = ["zero_factory"]


def zero_factory(resolve: Callable[[str], Callable[..., Optimizer]], **zero_kwargs: Any) -> Callable[[str], Any]:
    """A ``name -> factory`` like ``resolve`` whose factories build ``ZeroRedundancyOptimizer``
    over ``resolve(name)`` (which must be a ``torch.optim.Optimizer`` class); ``zero_kwargs``
    (``partitioner``, ``parameters_as_bucket_view``, ...) go to every one of them."""

    def resolve_zero(name: str) -> Callable[..., Optimizer]:
        optimizer_class = resolve(name)
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(
                f"zero_factory: optimizer {name!r} is built by {optimizer_class!r}, not a torch.optim.Optimizer "
                "class; ZeRO wraps optimizer classes only (use AdamW, Adam, ...)"
            )

        def build(param_groups: Any, **kwargs: Any) -> ZeroRedundancyOptimizer:
            return ZeroRedundancyOptimizer(param_groups, optimizer_class, **zero_kwargs, **kwargs)

        return build

    return resolve_zero
