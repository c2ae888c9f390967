"""One problem, one line: failures that follow from another problem are folded into it, and keys
that exclude each other are named together.

:func:`unresolved_problems` turns the interpolation failures the checks meet
(``data.vocab_size: ${model.vocab_size}`` with a model that has no ``vocab_size``) into one line
per key, and drops them when a reported problem already names both groups the interpolation
joins (``data=tokens: model=mlp is a 'regression' model ...``: the missing key follows from the
mismatch). :func:`exclusive_key_problems` refuses ``partitioner=manual`` with both or neither
of ``order`` and ``params_per_rank``, naming the keys and the fix, before the partitioner is
built. Both means both given: the preset's own default of one yields to the other
(:data:`UNLESS`), so ``partitioner=manual 'partitioner.params_per_rank=[[...],[...]]'`` runs.

    problems += unresolved_problems(failures, problems, choices)
    exclusive_key_problems(cfg.partitioner, "partitioner=manual")   # [] or one line
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from zero_lab.partition import Manual

__all__ = ["UNLESS", "exclusive_key_problems", "unresolved_problems"]

#: ``${zero_lab.unless:<other key>,<default>}``: ``default`` while the other key is null, else null.
#: A preset's default for one of two keys that exclude each other, which yields to the other:
#: ``conf/partitioner/manual.yaml``'s ``order: ${zero_lab.unless:${.params_per_rank},["*"]}``
#: keeps the model's order until ``params_per_rank`` is given. Registered when this module is
#: imported (every process that checks or runs a job imports it), as Hydra registers its own.
UNLESS = "zero_lab.unless"
if not OmegaConf.has_resolver(UNLESS):
    OmegaConf.register_new_resolver(UNLESS, lambda other, default: default if other is None else None)

_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")


def unresolved_problems(
    failures: Sequence[InterpolationResolutionError], reported: Sequence[str], choices: Mapping[str, Any]
) -> list[str]:
    """One line per key whose interpolation failed (every check that resolved the config met the
    same failure); none for a failure a line of ``reported`` already explains (it names both
    groups, ``data=...`` and ``model=...``)."""
    out: dict[str, str] = {}
    located = {_first_line(e) for e in failures if getattr(e, "full_key", "")}
    for error in failures:
        key = str(getattr(error, "full_key", "") or "?")
        message = _first_line(error)
        if key == "?" and message in located:  # the same failure, met where its key was not known
            continue
        found = _MISSING_KEY.search(message)
        missing = found.group(1) if found else None
        groups = {_group(key)} | ({_group(missing)} if missing else set())
        if any(all(f"{group}=" in line for group in groups) for line in reported if len(groups) > 1):
            continue  # e.g. the model/data task mismatch: the interpolation between them follows from it
        if key in out:
            continue
        if missing and "." in missing and choices.get(_group(missing)):
            owner = _group(missing)
            out[key] = (
                f"{key}: follows ${{{missing}}}, but {owner}={choices[owner]} has no {missing.split('.', 1)[1]}; "
                f"set {key}=<value>, or pick a {owner} that has it"
            )
        elif missing:
            out[key] = f"{key}: follows ${{{missing}}}, which names no key of the config; set {key}=<value>"
        else:
            out[key] = f"{key}: {message}"
    return list(out.values())


def _first_line(error: InterpolationResolutionError) -> str:
    return str(getattr(error, "msg", None) or error).strip().splitlines()[0]


def _group(key: str) -> str:
    return key.split(".", 1)[0]


def exclusive_key_problems(node: DictConfig, name: str) -> list[str]:
    """``partitioner=manual`` takes ``order`` or ``params_per_rank``: exactly one of them (its
    YAML's default ``order`` yields to a given ``params_per_rank``). ``name``: how the option is
    written (``partitioner=manual``)."""
    try:
        target = get_object(str(node.get("_target_")))
    except (ImportError, ValueError):  # get_object's: an unimportable target is _check_arguments'
        return []
    if not (isinstance(target, type) and issubclass(target, Manual)):
        return []
    order, listed = node.get("order"), node.get("params_per_rank")
    if order is None and listed is None:
        return [
            f"partitioner.order=null: {name} needs partitioner.order (ordered name patterns, any world size) or "
            "partitioner.params_per_rank (one list of patterns per rank); set one, e.g. 'partitioner.order=[\"*\"]'"
        ]
    if order is not None and listed is not None:
        return [
            "partitioner.order and partitioner.params_per_rank are both given: "
            f"{name} takes one; drop one, or set it to null (partitioner.order=null)"
        ]
    return []
