"""The shipped options a message suggests: each group's YAMLs read as written, filtered by what they build.

A rule that refuses a value names what to pick instead, from the options in ``conf/<group>/``
(:func:`~zero_lab.app.config.paths.group_options`, so a new YAML shows up); an option that cannot
be read or built is left out.

    either("optim", zero_options())   # "optim=zero_adam, optim=zero_adamw, ... or optim=zero_sgd"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hydra.errors import HydraException
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.config.paths import CONF_DIR, group_options
from zero_lab.app.config.targets import build
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.optimizer import check_partition_fits
from zero_lab.partition import ParamSpec, bucket_use

__all__ = ["data_for_task", "either", "fitting_partitioners", "on_device", "options_where", "zero_options"]


def either(group: str, names: Sequence[str]) -> str:
    """``optim=zero_adam, optim=zero_sgd or optim=zero_muon``: options of ``group`` to pick from,
    each as the command line writes it."""
    picks = [f"{group}={name}" for name in names] or [f"another {group} option"]
    return ", ".join(picks[:-1]) + f" or {picks[-1]}" if len(picks) > 1 else picks[0]


def zero_options() -> list[str]:
    """The ``optim`` options that build a ZeRO optimizer."""
    return options_where("optim", lambda node: OptimPlan.of(node).strategy.shards_state)


def on_device(device: str) -> list[str]:
    """The ``dist`` options that put the ranks on ``device``."""
    return options_where("dist", lambda node: node.get("device") == device)


def data_for_task(task: Any) -> list[str]:
    """The ``data`` options whose class reads batches for a model of ``task``."""
    return options_where("data", lambda node: get_object(str(node.get("_target_"))).task == task)


def fitting_partitioners(
    specs: list[ParamSpec], world: int, optimizer_class: type, classes: list[type] | None
) -> list[str]:
    """The ``partitioner`` options (as shipped) whose partition of ``specs`` the optimizer can step."""

    def fits(node: DictConfig) -> bool:
        if bucket_use(get_object(str(node.get("_target_")))).needs_ddp_buckets:
            return False
        kept = OmegaConf.create({k: v for k, v in node.items() if k != "defaults"})
        partitioner = build(kept, "partitioner")
        check_partition_fits(partitioner(specs, world), optimizer_class, partitioner, classes)
        return True

    return options_where("partitioner", fits)


def options_where(group: str, test: Callable[[DictConfig], bool]) -> list[str]:
    """The shipped options of ``group`` whose node, its YAML as written, passes ``test``."""
    out = []
    for name in group_options(group):
        try:
            if test(OmegaConf.load(CONF_DIR / group / f"{name}.yaml")):
                out.append(name)
        except (ImportError, TypeError, ValueError, HydraException, OmegaConfBaseException):  # does not build
            continue
    return out
