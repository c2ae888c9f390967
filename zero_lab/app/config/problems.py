"""One problem, one line: failures that follow from another problem are folded into it, and keys
that exclude each other are named together.

:func:`unresolved_problems` turns the interpolation failures the checks meet
(``data.vocab_size: ${model.vocab_size}`` with a model that has no ``vocab_size``) into one line
per key, and drops them when a reported problem already names both groups the interpolation
joins (``data=tokens: model=mlp is a 'regression' model ...``: the missing key follows from the
mismatch). :func:`exclusive_key_problems` refuses ``partitioner=manual`` with both or neither
of ``order`` and ``params_per_rank``, naming the keys and the fix, before the partitioner is
built.

    problems += unresolved_problems(failures, problems, choices)
    exclusive_key_problems(cfg.partitioner, "partitioner=manual")   # [] or one line
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig
from omegaconf.errors import InterpolationResolutionError

from zero_lab.partition import Manual

__all__ = ["exclusive_key_problems", "unresolved_problems"]

_MISSING_KEY = re.compile(r"Interpolation key '([^']+)' not found")


def unresolved_problems(
    failures: Sequence[InterpolationResolutionError], reported: Sequence[str], choices: Mapping[str, Any]
) -> list[str]:
    """One line per key whose interpolation failed (every check that resolved the config met the
    same failure); none for a failure a line of ``reported`` already explains (it names both
    groups, ``data=...`` and ``model=...``)."""
    out: dict[str, str] = {}
    for error in failures:
        key = str(getattr(error, "full_key", "") or "?")
        message = str(getattr(error, "msg", error)).strip().splitlines()[0]
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


def _group(key: str) -> str:
    return key.split(".", 1)[0]


def exclusive_key_problems(node: DictConfig, name: str) -> list[str]:
    """``partitioner=manual`` takes ``order`` or ``params_per_rank``: exactly one of them
    (its YAML sets the other to null). ``name``: how the option is written (``partitioner=manual``)."""
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
            "partitioner.order and partitioner.params_per_rank are both set: "
            f"{name} takes one; to give params_per_rank add partitioner.order=null (or drop params_per_rank)"
        ]
    return []
