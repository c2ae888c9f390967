"""Check the command line before Hydra starts anything: one readable message, exit 2.

``train.py`` calls :func:`preflight` with its overrides. It composes the config of every
job the command would run (a ``-m`` sweep is expanded as the basic sweeper does, from
Hydra's public override parser) with Hydra's Compose API, then runs
:func:`zero_lab.app.validate.check` and records each checked job
(:func:`~zero_lab.app.validate.mark_checked`), so the job itself does not check again.
Anything wrong — an unknown group option, a typo'd key, a wrong type, a range or a
combination that cannot work — becomes one :class:`~zero_lab.app.validate.ConfigError`
that names the key (and, in a sweep, the job) and what is allowed, instead of Hydra's
multi-line report or a rank's traceback.

    cfg, hydra_node = preflight(["optim=zero_adam", "dist.world_size=0"])   # raises ConfigError
"""

from __future__ import annotations

import difflib
import importlib.util
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    ConfigTypeError,
    OmegaConfBaseException,
    ValidationError,
)

from zero_lab.app.paths import CONF_DIR
from zero_lab.app.schema import HYDRA_KEYS
from zero_lab.app.validate import ConfigError, check, mark_checked

__all__ = ["compose_job", "describe_hydra_error", "preflight", "sweep_jobs", "user_config_dirs"]

MAX_JOBS = 64
_HIDDEN_KEYS = (*HYDRA_KEYS, "hydra")


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The override list of every job of a ``-m`` sweep (the cartesian product of the
    sweep overrides, in order). Where a sweeper plugin must expand a sweep (Optuna's
    ``interval(...)``), the one job of the fixed overrides: every trial checks its own
    config when it starts."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    choices: list[list[str]] = []
    for override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices.append([f"{key}={override.get_value_element_as_str()}"])
        elif override.is_discrete_sweep():
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            return [[o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]]
    return [list(job) for job in itertools.product(*choices)]


def user_config_dirs(overrides: Sequence[str], config_dir: str | None = None) -> list[Path]:
    """The user's config dirs, in Hydra's search order: ``--config-dir``, then the entries of a
    ``hydra.searchpath=[...]`` override (``file://<dir>``, ``pkg://<module>`` or a plain path)."""
    found = [Path(config_dir).expanduser().resolve()] if config_dir else []
    for override in OverridesParser.create().parse_overrides([o for o in overrides if "searchpath" in o]):
        if override.get_key_element() != "hydra.searchpath":
            continue
        for entry in override.value() or []:
            where = _search_path_dir(str(entry))
            if where is not None:
                found.append(where)
    return found


def _search_path_dir(entry: str) -> Path | None:
    if entry.startswith("pkg://"):
        spec = importlib.util.find_spec(entry.removeprefix("pkg://").replace("/", "."))
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    return Path(entry.removeprefix("file://")).expanduser().resolve()


def compose_job(
    overrides: Sequence[str],
    config_name: str = "config",
    config_dir: Path = CONF_DIR,
    user_dir: Path | None = None,
) -> tuple[DictConfig, dict[str, Any], DictConfig]:
    """Compose one job: ``(cfg without hydra, group choices, hydra node)``. ``user_dir`` is
    ``--config-dir``: searched after ``config_dir``, before any ``hydra.searchpath`` entry, as Hydra does."""
    overrides = _with_user_dir(list(overrides), user_dir) if user_dir is not None else list(overrides)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="train"):
        full = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    hydra_node = full.hydra
    choices = OmegaConf.to_container(hydra_node.runtime.choices)
    with open_dict(full):
        del full["hydra"]
    return full, dict(choices), hydra_node  # type: ignore[arg-type]


def _with_user_dir(overrides: list[str], user_dir: Path) -> list[str]:
    """``--config-dir`` as the first entry of ``hydra.searchpath`` (the compose API has no such flag)."""
    entries = [f"file://{user_dir}"]
    rest = []
    parser = OverridesParser.create()
    for override in overrides:
        parsed = parser.parse_override(override)
        if parsed.get_key_element() == "hydra.searchpath":
            entries += [str(e) for e in parsed.value() or []]
        else:
            rest.append(override)
    return [*rest, f"hydra.searchpath=[{','.join(entries)}]"]


def preflight(
    overrides: Sequence[str], multirun: bool = False, config_name: str = "config", user_dir: Path | None = None
) -> tuple[DictConfig, DictConfig]:
    """Compose and check every job; return the first job's ``(cfg, hydra node)``. Raises ConfigError.

    ``user_dir`` is ``--config-dir``: its YAMLs (and those of ``hydra.searchpath`` entries) are
    composed and checked as ours are; their schemas must be registered first
    (:func:`zero_lab.app.schema.register_configs` with :func:`user_config_dirs`)."""
    try:
        jobs = sweep_jobs(overrides) if multirun else [list(overrides)]
    except HydraException as error:
        raise ConfigError([describe_hydra_error(error)]) from None
    first: tuple[DictConfig, DictConfig] | None = None
    checked = []
    for job in jobs[:MAX_JOBS]:
        name = " ".join(job) if multirun and len(jobs) > 1 else None
        try:
            cfg, choices, hydra_node = compose_job(job, config_name, user_dir=user_dir)
        except (HydraException, OmegaConfBaseException) as error:
            raise ConfigError([describe_hydra_error(error)], job=name) from None
        try:
            check(cfg, choices)
        except ConfigError as error:
            raise ConfigError(error.problems, job=name) from None
        checked.append(cfg)
        first = first or (cfg, hydra_node)
    mark_checked(checked)
    assert first is not None
    return first


def describe_hydra_error(error: BaseException) -> str:
    """One line (or a few) naming the key and what is allowed, from Hydra/OmegaConf errors."""
    if isinstance(error, MissingConfigException) and error.options is not None:
        group, _, name = (error.missing_cfg_file or "").rpartition("/")
        return f"{group}={name}: no such option; choose one of: {', '.join(sorted(error.options))}"
    cause = error.__cause__ if isinstance(error, ConfigCompositionException) and error.__cause__ else error
    override = _override_in(str(error))
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return _unknown_key(cause, override)
    if isinstance(cause, ConfigTypeError) and "deletion" in str(cause) and override:
        key = override.lstrip("~").split("=", 1)[0]
        group = key.split(".", 1)[0]
        return (
            f"{override}: the keys of {group} are its _target_'s arguments and cannot be removed; set the value "
            f"instead ({key}=<value>, or null where the argument is optional); for a class with other arguments "
            f"write its own YAML in a config dir of yours: --config-dir DIR with DIR/{group}/<name>.yaml "
            "(docs/own-model.md)"
        )
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", None) or override
        value = f"={override.split('=', 1)[1]}" if override and "=" in override else ""
        message = _first_line(getattr(cause, "msg", str(cause)))
        hint = next((h for word, h in _TYPE_HINTS.items() if word in message), "")
        return f"{key}{value}: {message}{hint}"
    if "--multirun" in str(error):  # "Ambiguous value for argument 'optim=adam,zero_adam'" and Hydra's 3 ways out
        return (
            f"{_first_line(str(error))}: to sweep over it add -m (--multirun); as a list write key=[a,b]; "
            "as a string quote it: key='a,b'"
        )
    return _first_line(str(error))


_TYPE_HINTS = {
    "valid bool": " (use true or false)",
    "converted to Float": " (expected a number, e.g. 1e-3)",
    "converted to Integer": " (expected an integer)",
}


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


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message
