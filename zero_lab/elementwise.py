"""Which optimizer classes are *elementwise*: each element's update reads only that element.

An elementwise optimizer (SGD, Adam, AdamW, ...) may step a parameter cut into element
ranges on different ranks (:class:`~zero_lab.partition.Flat`); a matrix optimizer
(``torch.optim.Muon`` orthogonalises the whole gradient, ``torch.optim.Adafactor``
factors its second moment by rows and columns) needs each parameter whole.

A class declares it, first match wins:

1. a class attribute ``elementwise = True`` / ``False`` (its own or inherited), so a
   subclass of Adam whose update mixes elements can say ``elementwise = False``;
2. :func:`register_elementwise` — for a third-party class you cannot edit; the registry
   is seeded with torch's elementwise classes (:data:`ELEMENTWISE_OPTIMIZERS`);
3. otherwise it is not elementwise (the safe answer: whole parameters always work).

    register_elementwise(Lion)
    is_elementwise(torch.optim.AdamW), is_elementwise(torch.optim.Muon)   # True, False
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer

__all__ = ["ELEMENTWISE_OPTIMIZERS", "is_elementwise", "register_elementwise"]

#: torch's elementwise classes, the registry's seed (the old closed tuple; kept importable).
ELEMENTWISE_OPTIMIZERS: tuple[type[Optimizer], ...] = tuple(
    getattr(torch.optim, name)
    for name in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD", "Rprop")
    if hasattr(torch.optim, name)
)

_registered: list[type[Optimizer]] = list(ELEMENTWISE_OPTIMIZERS)


def register_elementwise(cls: type[Optimizer]) -> type[Optimizer]:
    """Declare ``cls`` (and its subclasses) elementwise; returns it, so it works as a decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise TypeError(f"register_elementwise needs a torch.optim.Optimizer subclass, got {cls!r}")
    if cls not in _registered:
        _registered.append(cls)
    return cls


def is_elementwise(cls: type[Optimizer]) -> bool:
    """Whether ``cls`` steps each element from that element alone (see the module docstring)."""
    declared = getattr(cls, "elementwise", None)
    if isinstance(declared, bool):
        return declared
    return issubclass(cls, tuple(_registered))


def registered() -> tuple[type[Optimizer], ...]:
    """Every class :func:`is_elementwise` accepts through the registry (seed first)."""
    return tuple(_registered)
