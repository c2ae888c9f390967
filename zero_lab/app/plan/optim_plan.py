"""What ``cfg.optim`` builds, answered from the config: is it ZeRO, which class steps.

Every part of the app that asks "which ``torch.optim`` class holds the state?" reads one
:class:`OptimPlan`; what ZeRO changes is asked of :attr:`OptimPlan.strategy`. Making one looks
classes up and calls nothing: ``optim.optimizer_class`` must be a lookup
(:data:`~zero_lab.app.config.targets.LOOKUPS`).

    plan = OptimPlan.of(cfg.optim)
    plan.strategy.shards_state, plan.optimizer_class.__name__, plan.name     # True, "Adam", "Adam"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_object

from zero_lab.app.config.targets import LOOKUPS
from zero_lab.app.plan.strategy import Strategy
from zero_lab.chained import GROUP_CLASS_KEY, group_class
from zero_lab.optimizer import ZeroRedundancyOptimizer

__all__ = ["OptimPlan"]


@dataclass(frozen=True)
class OptimPlan:
    """What an ``optim`` node builds (module docstring)."""

    target: Any  # the class optim._target_ names (ZeroRedundancyOptimizer, ChainedOptimizer, torch.optim.Adam)
    optimizer_class: Any  # the class that holds and steps the state (a wrapper's optimizer_class, else the target)
    zero: bool  # it shards the state (a ZeroRedundancyOptimizer)
    routed: bool = False  # optim.param_groups is set: a group may name a class of its own (group_classes)

    @classmethod
    def of(cls, optim: Mapping[str, Any]) -> OptimPlan:
        """The plan of an ``optim`` node (as composed, or a YAML as written); raises
        ``ValueError`` naming the key when a class cannot be looked up."""
        target = get_object(str(optim.get("_target_")))
        zero = isinstance(target, type) and issubclass(target, ZeroRedundancyOptimizer)
        inner = optim.get(GROUP_CLASS_KEY)
        stepping = target if inner is None else _looked_up(inner, "optim.optimizer_class")
        return cls(target, stepping, zero, routed=optim.get("param_groups") is not None)

    @property
    def strategy(self) -> Strategy:
        """Plain DDP or ZeRO (what differs is asked of it)."""
        return Strategy.of(self.zero)

    @property
    def name(self) -> str:
        """``Adam`` for optim=adam and optim=zero_adam alike (the class holding the state)."""
        name = getattr(self.optimizer_class, "__name__", str(self.optimizer_class))
        return f"{name} + the classes optim.param_groups names" if self.routed else name

    def group_classes(self, groups: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The class that steps each param group (its own ``optimizer_class``, else this plan's)."""
        return [group_class(group, self.optimizer_class) for group in groups]


def _looked_up(node: Any, key: str) -> Any:
    """The class a lookup node (``{_target_: hydra.utils.get_class, path: ...}``) names; a node whose
    ``_target_`` is another callable is refused before it could run (``builtins.open`` would create a file)."""
    target = str(node.get("_target_")) if isinstance(node, Mapping) else None
    if target not in LOOKUPS:
        raise ValueError(
            f"{key}._target_={target}: must be hydra.utils.get_class (a lookup, with {key}.path=<a class>); "
            "nothing else is called before the config is accepted"
        )
    return get_object(str(node.get("path")))
