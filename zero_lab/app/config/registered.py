"""``exchange=`` and ``grad_reduce=``: chosen from the core's registries as they are, not as they were at import.

A value is a registered name (``auto``: time every registered one), looked up when the job is
checked and when each rank builds its optimizer, so a class your entry script registered first
is a choice; or the dotted path of a class of yours, held to the rule of every ``_target_``,
imported and registered (:func:`zero_lab.collectives.register_collective`,
:func:`zero_lab.grad_reduce.register_grad_reduce`) on every rank.

    exchange_name("my_project.collectives.PaddedAllReduce")   # -> "all_reduce", now registered
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig

from zero_lab.app.config.schema import enum_str
from zero_lab.app.config.targets import target_problem
from zero_lab.collectives import register_collective, registered_collectives
from zero_lab.grad_reduce import register_grad_reduce, registered_grad_reduces

__all__ = [
    "EXCHANGE",
    "GRAD_REDUCE",
    "RegisteredKey",
    "chosen",
    "exchange_name",
    "grad_reduce_name",
    "name_or_value",
    "registry_problems",
]


@dataclass(frozen=True)
class RegisteredKey:
    """A config key whose values name a strategy of one core registry (:class:`zero_lab.registry.Registry`)."""

    key: str  # the config key: exchange, grad_reduce
    names: Callable[[], tuple[str, ...]]  # the registered names, now
    register: Callable[[type], type]  # the core's register function (a no-op for a registered class)
    protocol: str  # the Protocol a class must satisfy, for the message


EXCHANGE = RegisteredKey("exchange", registered_collectives, register_collective, "zero_lab.collectives.Collective")
GRAD_REDUCE = RegisteredKey(
    "grad_reduce", registered_grad_reduces, register_grad_reduce, "zero_lab.grad_reduce.GradReduce"
)


def chosen(registry: RegisteredKey, value: Any) -> str:
    """The registered name ``value`` picks (module docstring); ``ValueError`` naming the key otherwise."""
    value = enum_str(value)
    names = ("auto", *registry.names())
    if value in names:
        return value
    if "." not in value:
        raise ValueError(
            f"{registry.key}={value}: not a registered name ({', '.join(names)}); give the dotted path of a "
            f"{registry.protocol} class of yours ({registry.key}=my_project.MyClass), or register it before the job "
            f"starts"
        )
    problem = target_problem(registry.key, {"_target_": value})
    if problem:
        raise ValueError(problem)
    cls = get_object(value)  # target_problem imported it and found it allowed
    if not isinstance(cls, type):
        raise ValueError(f"{registry.key}={value}: a {type(cls).__name__}, not a class ({registry.protocol})")
    try:
        registry.register(cls)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{registry.key}={value}: {error}") from None
    return str(cls.name)  # type: ignore[attr-defined]


def exchange_name(value: Any) -> str:
    """The collective ``exchange=value`` picks: a registered name or ``auto``."""
    return chosen(EXCHANGE, value)


def grad_reduce_name(value: Any) -> str | None:
    """The strategy ``grad_reduce=value`` picks (``None``: DDP's own all-reduce)."""
    return None if value is None else chosen(GRAD_REDUCE, value)


def name_or_value(registry: RegisteredKey, value: Any) -> str:
    """The name ``value`` picks, or ``value`` itself where it picks none (:func:`registry_problems` says why)."""
    try:
        return chosen(registry, value)
    except ValueError:
        return enum_str(value)


def registry_problems(cfg: DictConfig, choices: Mapping[str, Any], plan: Any) -> list[str]:
    """One line per ``exchange=`` / ``grad_reduce=`` value that names no registered class (a check rule)."""
    out = []
    for registry in (EXCHANGE, GRAD_REDUCE):
        value = cfg.get(registry.key)
        if value is None:
            continue
        try:
            chosen(registry, value)
        except ValueError as error:
            out.append(str(error))
    return out
