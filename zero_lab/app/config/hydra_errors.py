"""Hydra's and OmegaConf's composition errors as one line that names the key and what is allowed.

Hydra reports a config it cannot compose (an unknown key or group option, a wrong type, a
comma list without ``-m``) in several lines with a hint about ``HYDRA_FULL_ERROR``;
:func:`describe_hydra_error` says it as every other config problem is said.

    describe_hydra_error(error)  # "optim=nope: no such option; choose one of: adam, sgd, ..."
"""

from __future__ import annotations

import difflib

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    ConfigTypeError,
    OmegaConfBaseException,
    ValidationError,
)

from zero_lab.app.config.overrides import read
from zero_lab.app.config.problems import first_line
from zero_lab.app.config.schema import HYDRA_KEYS

__all__ = ["describe_hydra_error"]

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
    """The command-line argument Hydra could not parse, named; several ``key=value`` pairs in one
    (quoted) argument are said as such, with the arguments they should be."""
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
