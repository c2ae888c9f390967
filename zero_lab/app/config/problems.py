"""One problem, one line: Hydra's composition errors, failures that follow from another problem, and
keys that exclude each other.

:func:`describe_hydra_error` names the key and what is allowed where Hydra writes several lines.
:func:`unresolved_problems` words each failed interpolation once, and not at all where a reported
problem names both groups it joins. :func:`exclusive_key_problems` refuses ``partitioner=manual``
with both or neither of ``order`` and ``params_per_rank`` (a preset's default of one yields to
the other: :data:`UNLESS`).

    describe_hydra_error(error)  # "optim=nope: no such option; choose one of: adam, sgd, ..."
    problems += unresolved_problems(failures, problems, choices)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    ConfigTypeError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from zero_lab.app.config.overrides import read
from zero_lab.app.config.schema import HYDRA_KEYS
from zero_lab.partition import Manual

__all__ = ["UNLESS", "describe_hydra_error", "exclusive_key_problems", "first_line", "unresolved_problems"]

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
        if key in out or any(all(f"{group}=" in line for group in groups) for line in reported if len(groups) > 1):
            continue  # said already, or it follows from a reported mismatch of both groups (the model/data task)
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
    """``partitioner=manual`` (``name``) takes exactly one of ``order`` and ``params_per_rank``."""
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


_HIDDEN_KEYS = (*HYDRA_KEYS, "hydra")


def describe_hydra_error(error: BaseException) -> str:
    """One line (or a few) naming the key and what is allowed, from Hydra/OmegaConf errors."""
    if isinstance(error, OverrideParseException):
        return _unparsable(error)
    if isinstance(error, MissingConfigException) and error.options is not None:
        group, _, name = (error.missing_cfg_file or "").rpartition("/")
        return f"{group}={name}: no such option; choose one of: {', '.join(sorted(error.options))}"
    cause = error.__cause__ if isinstance(error, ConfigCompositionException) and error.__cause__ else error
    override = _override_in(str(error))
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return _unknown_key(cause, override)
    if isinstance(cause, ConfigTypeError) and "deletion" in str(cause) and override:
        key, group = (parsed := read([override])[0]).key, parsed.root
        return (
            f"{override}: the keys of {group} are its _target_'s arguments and cannot be removed; set the value "
            f"instead ({key}=<value>, or null where the argument is optional); for a class with other arguments "
            f"write its own YAML in a config dir of yours: --config-dir DIR with DIR/{group}/<name>.yaml "
            "(docs/own-model.md)"
        )
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", None) or override
        given_value = read([override])[0].value if override else None
        value = "" if given_value is None else f"={given_value}"
        message = first_line(getattr(cause, "msg", str(cause)))
        hint = next((h for word, h in _TYPE_HINTS.items() if word in message), "")
        return f"{key}{value}: {message}{hint}"
    if "--multirun" in str(error):  # "Ambiguous value for argument 'optim=adam,zero_adam'" and Hydra's 3 ways out
        return (
            f"{first_line(str(error))}: to sweep over it add -m (--multirun); as a list write key=[a,b]; "
            "as a string quote it: key='a,b'"
        )
    return first_line(str(error))


_TYPE_HINTS = {
    "valid bool": " (use true or false)",
    "converted to Float": " (expected a number, e.g. 1e-3)",
    "converted to Integer": " (expected an integer)",
}


def _unparsable(error: OverrideParseException) -> str:
    """The argument Hydra could not parse, named (several ``key=value`` pairs in one are said as such)."""
    argument = error.override
    words = argument.split()
    if len(words) > 1 and sum("=" in word for word in words) > 1:
        return (
            f"'{argument}': several overrides in one argument; give each as its own argument: {' '.join(words)} "
            "(quote only a value that holds spaces: key='a b')"
        )
    reason = first_line(error.message).removeprefix("LexerNoViableAltException: ")
    return (
        f"'{argument}': not an override Hydra can parse ({reason}); write key=value, quoting a value with spaces or "
        "brackets ('key=[a,b]', \"key='a b'\"); see https://hydra.cc/docs/advanced/override_grammar/basic/"
    )


def _unknown_key(error: OmegaConfBaseException, override: str | None) -> str:
    key = getattr(error, "full_key", None) or override or "?"
    parent = getattr(error, "parent_node", None)
    allowed = [str(k) for k in parent if k not in _HIDDEN_KEYS] if isinstance(parent, DictConfig) else []
    parent_key, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, allowed, n=1)
    guess = f"did you mean {'.'.join(filter(None, [parent_key, close[0]]))}? " if close else ""
    where = parent_key or "the top level"
    return f"{key}: no such key; {guess}{where} takes: {', '.join(allowed)}"


def _override_in(message: str) -> str | None:
    """The override an error message quotes ("Could not override 'x'", "Error merging override x=1")."""
    for marker in ("Could not override '", "Error merging override "):
        if marker in message:
            rest = message.split(marker, 1)[1]
            return rest.split("'", 1)[0].splitlines()[0].strip() if marker.endswith("'") else rest.splitlines()[0]
    return None
