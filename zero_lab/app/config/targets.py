"""Every ``_target_`` the app builds, checked before anything is called; built and worded after.

Hydra's ``instantiate`` imports a dotted path and *calls* whatever it finds there, nested
nodes first: ``data._target_=builtins.open`` with ``mode: w`` truncates a file. So before any
rule of the config check builds anything (:func:`zero_lab.app.check.rules.check` calls
:func:`check_targets` first and stops on a problem), every node with a ``_target_`` in the
groups the app instantiates is **resolved by import and lookup only** (``hydra.utils.get_object``)
and refused unless it fits its key (:data:`RULES`: ``model`` a ``torch.nn.Module`` subclass,
``optim.param_groups`` a ``_partial_`` function of the model, ...; a nested node a lookup, a
class or a function of yours), and never anything of the standard library (``os.system``,
``logging.basicConfig``...), nor a function of torch (``torch.save``), nor of torch's I/O and
process machinery (:data:`TORCH_MACHINERY`), nor Hydra's or OmegaConf's own
(``hydra.utils.call`` would build a node nobody checked). A lookup's ``path`` is held to the same rule.

:func:`build` instantiates a node that fits its key and re-raises a constructor's own error
without Hydra's "Error in call to target" wrapper; :func:`refusal` words it as one line
naming the configured keys the error mentions (``partitioner.cost=bogus: ...``).

    problems = check_targets(cfg)          # [] or one line per refused _target_
    partitioner = build(cfg.partitioner, "partitioner")
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.config.problems import first_line

__all__ = ["LOOKUPS", "TORCH_MACHINERY", "build", "check_targets", "refusal", "target_problem"]

#: ``_target_``s that only look a dotted path up (``path:``), calling nothing found there.
LOOKUPS = ("hydra.utils.get_class", "hydra.utils.get_object", "hydra.utils.get_method")

#: torch's modules that write files, start processes or log: none of their names is a target.
TORCH_MACHINERY = (
    "torch.serialization",
    "torch.hub",
    "torch.multiprocessing",
    "torch.distributed",
    "torch.utils.tensorboard",
    "torch.utils.data",
    "torch.utils.cpp_extension",
    "torch.profiler",
    "torch.autograd.profiler",
    "torch.jit",
    "torch.onnx",
    "torch.export",
    "torch.package",
    "torch._logging",
)

#: Frameworks whose callables build or save configs (``hydra.utils.call``, ``OmegaConf.save``).
_FRAMEWORKS = ("hydra", "omegaconf")
_PROTOCOLS = "zero_lab/app/workloads/protocols.py"


@dataclass(frozen=True)
class _Rule:
    """What a key's ``_target_`` must be: ``test(obj) -> bool`` and the words for it."""

    test: Callable[[Any], bool]
    wants: str


def _is_class(obj: Any, base: type) -> bool:
    return isinstance(obj, type) and issubclass(obj, base)


def _has(obj: Any, *methods: str) -> bool:
    return isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in methods)


def _is_partitioner(obj: Any) -> bool:
    return isinstance(obj, type) and any("__call__" in vars(klass) for klass in obj.__mro__[:-1])


def _is_scheduler(obj: Any) -> bool:
    own = not _module_of(obj).startswith("torch")  # a torch class with step() that is no scheduler is refused
    return _is_class(obj, torch.optim.lr_scheduler.LRScheduler) or (own and _has(obj, "step"))


_OPTIMIZER = "a torch.optim.Optimizer subclass"
_SINK = "a class with log, summary and close (zero_lab.app.record.sinks.MetricSink)"
_DATA = f"a class with shard(step, rank, world_size) or batches(rank, world_size, start_step) ({_PROTOCOLS})"

#: The rule of each key the app instantiates (a group, or a node it reads inside one).
RULES: dict[str, _Rule] = {
    "model": _Rule(lambda t: _is_class(t, torch.nn.Module), "a torch.nn.Module subclass (your model's class)"),
    "data": _Rule(lambda t: _has(t, "shard") or _has(t, "batches"), _DATA),
    "partitioner": _Rule(_is_partitioner, "a zero_lab.partition.Partitioner (a class whose instances are called)"),
    "optim": _Rule(lambda t: _is_class(t, torch.optim.Optimizer), _OPTIMIZER),
    "optim.optimizer_class": _Rule(
        lambda t: _is_class(t, torch.optim.Optimizer), f"hydra.utils.get_class with path=<{_OPTIMIZER}>"
    ),
    "optim.param_groups": _Rule(
        inspect.isfunction, "a Python function model -> param groups (zero_lab.muon_param_groups), _partial_: true"
    ),
    "scheduler": _Rule(_is_scheduler, "a torch.optim.lr_scheduler class, or a class of yours with step()"),
    "logger": _Rule(lambda t: _has(t, "log", "summary", "close"), _SINK),
}
_NESTED = _Rule(lambda t: isinstance(t, type) or inspect.isfunction(t), "a lookup, a class or a function of yours")
#: Keys whose node the app completes at the call site: the target must wait for those arguments.
_PARTIAL = ("optim.param_groups",)


def check_targets(cfg: Mapping[str, Any]) -> list[str]:
    """One line per ``_target_`` under the groups the app builds that does not fit its key, calling
    nothing but imports and lookups (a group's own unimportable target is the argument check's to name)."""
    problems = (target_problem(key, node) for key, node in _target_nodes(cfg))
    return [problem for problem in problems if problem]


def target_problem(key: str, node: Mapping[str, Any]) -> str | None:
    """Why ``node`` (at ``key``, e.g. ``"data"`` or ``"model.encoder"``) may not be built, or ``None``."""
    name = str(node.get("_target_"))
    rule = RULES.get(key, _NESTED)
    try:
        target = get_object(name)
    except (ImportError, ValueError) as error:  # get_object's (an import's own errors come as ImportError)
        return None if key in RULES and "." not in key else f"{key}._target_={name}: cannot be imported ({error})"
    if name in LOOKUPS:
        if key != "optim.optimizer_class" and key in RULES:  # a group builds an object, not a lookup
            return _refused(key, name, target, rule)
        return _lookup_problem(key, node, rule)
    denied = _denied(target)
    if denied or not rule.test(target) or key == "optim.optimizer_class":  # that one is a lookup or nothing
        return _refused(key, name, target, rule, denied)
    if key in _PARTIAL and not node.get("_partial_"):
        return f"{key}: add {key}._partial_=true ({name} is called with the model by the app, nothing else calls it)"
    if key in _PARTIAL and not _takes_model(target, node):
        return (
            f"{key}._target_={name}: must take the model as its first argument and the configured keys "
            f"({', '.join(_own_keys(node)) or 'none'}) as the others; it was not called"
        )
    return None


def build(node: Mapping[str, Any], key: str) -> Any:
    """``instantiate(node)`` once its ``_target_`` fits ``key`` (:func:`target_problem`'s line as a
    ``ValueError`` otherwise, nothing called); a constructor's own error is re-raised as itself,
    not inside Hydra's "Error in call to target" wrapper."""
    problem = target_problem(key, node)
    if problem:
        raise ValueError(problem)
    try:
        return instantiate(node)
    except InstantiationException as error:
        if isinstance(error.__cause__, Exception):
            raise error.__cause__ from None
        raise


def refusal(group: str, node: Mapping[str, Any], error: BaseException, blamed: Sequence[str] = ()) -> str:
    """``<group>.<key>=<value>: <Target> refuses it: <error>`` for the configured keys ``error``
    names (by ``key=`` or by value) and those in ``blamed``; without any, the target's name alone.
    A key the error already writes as ``<group>.<key>=`` is not repeated."""
    keys = _own_keys(node)
    text = first_line(str(error)) or type(error).__name__
    named = [k for k in keys if k in blamed or f"{k}=" in text or f"'{k}'" in text or _shows(text, node.get(k))]
    named = [k for k in named if f"{group}.{k}=" not in text]
    target = str(node.get("_target_", "?")).rsplit(".", 1)[-1]
    if not named:
        return f"{target} refuses the configured arguments: {text}" if f"{group}." not in text else f"{target}: {text}"
    shown = ", ".join(f"{group}.{k}={_plain(node.get(k))}" for k in named)
    return f"{shown}: {target} refuses {'it' if len(named) == 1 else 'them'}: {text}"


# ----------------------------------------------------------------------------- helpers
def _target_nodes(cfg: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(key, node)`` for every node with a ``_target_`` under the groups the app builds."""
    for group in (key for key in RULES if "." not in key):
        if isinstance(node := cfg.get(group), (Mapping, DictConfig)):
            yield from _walk(group, node)


def _walk(key: str, node: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Nodes with a ``_target_`` at and below ``node``, read without resolving the others'
    interpolations (one that does not resolve is the composition's to report, not this check's)."""
    if isinstance(node, (Mapping, DictConfig)):
        try:
            target = node.get("_target_")
        except OmegaConfBaseException:  # an interpolation that does not resolve: instantiate cannot call it either
            target = None
        if target is not None:
            yield key, node
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else node.items()
        for child, value in items:
            if str(child) not in ("_target_", "defaults"):
                yield from _walk(f"{key}.{child}", value)
    elif isinstance(node, (list, ListConfig)):
        items = OmegaConf.to_container(node, resolve=False) if isinstance(node, ListConfig) else node
        for index, value in enumerate(items):  # type: ignore[arg-type]
            yield from _walk(f"{key}.{index}", value)


def _lookup_problem(key: str, node: Mapping[str, Any], rule: _Rule) -> str | None:
    """A lookup node (``{_target_: hydra.utils.get_class, path: ...}``): its ``path`` fits the rule."""
    path = str(node.get("path"))
    try:
        found = get_object(path)
    except (ImportError, ValueError) as error:
        return f"{key}.path={path}: cannot be imported ({error})"
    denied = _denied(found)
    if denied or not rule.test(found):
        return _refused(f"{key}.path", path, found, rule, denied, field="")
    return None


def _module_of(obj: Any) -> str:
    return str(getattr(obj, "__module__", None) or "")


def _denied(obj: Any) -> str:
    """Why ``obj`` is never a target (its home: the standard library, torch's I/O and process
    machinery, a framework), or ``""``."""
    module = _module_of(obj)
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return "the standard library"
    if any(module == m or module.startswith(m + ".") for m in TORCH_MACHINERY):
        return "torch's I/O and process machinery"
    if top == "torch" and not isinstance(obj, type):
        return "torch's functions"
    if top in _FRAMEWORKS:
        return f"{top}'s own machinery"
    return ""


def _refused(key: str, name: str, target: Any, rule: _Rule, denied: str = "", field: str = "._target_") -> str:
    kind = "class" if isinstance(target, type) else "function" if callable(target) else type(target).__name__
    home = f" of {denied}" if denied else ""
    return f"{key}{field}={name}: must be {rule.wants}; it names a {kind}{home}, and was not called"


def _own_keys(node: Mapping[str, Any]) -> list[str]:
    return [str(k) for k in node if not str(k).startswith("_") and str(k) != "defaults"]


def _takes_model(target: Any, node: Mapping[str, Any]) -> bool:
    try:
        inspect.signature(target).bind(object(), **{k: None for k in _own_keys(node)})
    except (TypeError, ValueError):
        return False
    return True


def _shows(text: str, value: Any) -> bool:
    if isinstance(value, bool) or value is None or isinstance(value, (Mapping, DictConfig, list, ListConfig)):
        return False
    shown = re.escape(str(value))
    return len(str(value)) > 1 and re.search(rf"(?<![\w./-]){shown}(?![\w/-])", text) is not None


def _plain(value: Any) -> str:
    return str(list(value) if isinstance(value, ListConfig) else value)
