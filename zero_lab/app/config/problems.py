"""One problem, one line: failures that follow from another problem are folded into it, and keys
that exclude each other are named together.

:func:`unresolved_problems` turns the interpolation failures the checks meet into one line per
key, none where a reported problem already names both groups the interpolation joins (the
missing key follows from that mismatch). :func:`exclusive_key_problems` refuses
``partitioner=manual`` with both or neither of ``order`` and ``params_per_rank`` before the
partitioner is built; the preset's own default of one yields to the other (:data:`UNLESS`).

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

__all__ = ["UNLESS", "exclusive_key_problems", "first_line", "unresolved_problems"]

#: ``${zero_lab.unless:<other key>,<default>}``: ``default`` while the other key is null, else null
#: (``conf/partitioner/manual.yaml``'s ``order`` yields to a given ``params_per_rank``). Registered
#: on import: every process that checks or runs a job imports this module.
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
    located = {first_line(str(getattr(e, "msg", None) or e)) for e in failures if getattr(e, "full_key", "")}
    for error in failures:
        key = str(getattr(error, "full_key", "") or "?")
        message = first_line(str(getattr(error, "msg", None) or error))
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


def first_line(text: str) -> str:
    """The first line of ``text``, stripped (``""``: blank): how a config problem quotes an error."""
    return text.strip().splitlines()[0] if text.strip() else ""


def _group(key: str) -> str:
    return key.split(".", 1)[0]


def exclusive_key_problems(node: DictConfig, name: str) -> list[str]:
    """``partitioner=manual`` takes exactly one of ``order`` and ``params_per_rank``. ``name``: how
    the option is written (``partitioner=manual``)."""
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
