"""Compose and check a command line without running it: the library behind the config tests.

``train.py`` does not use this module: its config is composed once, by Hydra, and checked by
the callback :class:`zero_lab.app.check.callback.CheckConfig`. Here the same composition (Hydra's
Compose API, in run or multirun mode) feeds the same checks, so a test sees what
``python train.py <overrides>`` would say, without a run dir or a process:

    cfg, hydra_node = preflight(["optim=zero_adam", "dist.world_size=0"])   # raises ConfigError
    cfg, choices, hydra_node = compose_job(["optim=adam"])                # composed, not checked
    message = problems("dist.world_size=0")                               # the ConfigError's text

A composition costs about 150 ms of Hydra's time, and the config tests ask for a few hundred
command lines, most of them the default job with a value or two changed. So a command line is
composed in two parts, as Hydra itself composes it (``ConfigLoaderImpl._load_configuration_impl``):
the overrides that shape the defaults tree (``optim=adam``, ``experiment=...``, ``hydra/...``,
``+``/``++``/``~``, sweeps: :func:`_shapes_the_tree`) are composed by Hydra, once per distinct
list in this process (:func:`_compose_once`); the plain ``key=value`` overrides are then applied
to a deep copy with ``OmegaConf.update(cfg, key, value, merge=True)``, the call Hydra makes for
each of them after composing, on the same struct-mode config. An override that this refuses
(a wrong type, an unknown key) sends the whole command line to Hydra, so every error is
Hydra's own. ``tests/unit/test_config.py`` compares both ways on a set of command lines.
The schemas are registered once, when this module is imported (the tests that add config dirs
of their own register them again, with those dirs).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.check.callback import check_run, check_sweep, expand_sweep, job_config
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.config.paths import CONF_DIR
from zero_lab.app.config.problems import describe_hydra_error
from zero_lab.app.config.schema import register_configs

__all__ = ["compose_job", "preflight", "problems", "sweep_jobs"]

register_configs()


def compose_job(
    overrides: Sequence[str],
    config_name: str = "config",
    config_dir: Path = CONF_DIR,
    user_dir: Path | None = None,
) -> tuple[DictConfig, dict[str, Any], DictConfig]:
    """Compose one job: ``(cfg without hydra, group choices, hydra node)``; raises what Hydra raises.
    ``user_dir`` is ``--config-dir``: searched after ``config_dir``, before any ``hydra.searchpath``
    entry, as Hydra does."""
    full = _composed_in_two_parts(overrides, config_name, config_dir, user_dir)
    return job_config(full), dict(OmegaConf.to_container(full.hydra.runtime.choices)), full.hydra  # type: ignore[arg-type]


def preflight(
    overrides: Sequence[str], multirun: bool = False, config_name: str = "config", user_dir: Path | None = None
) -> tuple[DictConfig, DictConfig]:
    """What ``python train.py [-m] <overrides>`` checks before it starts: compose (as Hydra's
    ``run``/``multirun`` do) and check every job; return the first job's ``(cfg, hydra node)``.
    Raises ConfigError. The schemas of the user's YAMLs (``user_dir``, ``hydra.searchpath``)
    must be registered first (:func:`zero_lab.app.config.schema.register_configs`)."""
    if not multirun:
        with _as_config_error():
            config = _composed_in_two_parts(overrides, config_name, CONF_DIR, user_dir)
        return check_run(config), config.hydra
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        with _as_config_error():
            config = _compose(overrides, config_name, user_dir, RunMode.MULTIRUN)
        first = check_sweep(config)[0]  # Hydra's config loader composes each job (Hydra initialised)
    return job_config(first), first.hydra


def problems(*overrides: str, **preflight_kwargs: Any) -> str:
    """The ``ConfigError`` text :func:`preflight` raises for ``overrides`` (fails if it accepts them)."""
    with pytest.raises(ConfigError) as caught:
        preflight(list(overrides), **preflight_kwargs)
    return str(caught.value)


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The override list of every job ``python train.py -m <overrides>`` would run
    (:func:`zero_lab.app.check.callback.expand_sweep`)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        return expand_sweep(_compose(overrides, "config", None, RunMode.MULTIRUN))


def _composed_in_two_parts(
    overrides: Sequence[str], config_name: str, config_dir: Path, user_dir: Path | None
) -> DictConfig:
    """The command line composed as the module docstring says: the overrides that shape the
    defaults tree by Hydra (once: :func:`_compose_once`), the plain values applied to a copy as
    Hydra applies them; where one is refused, or cannot be parsed, the whole command line by Hydra."""
    whole = functools.partial(_compose_once, tuple(overrides), config_name, config_dir, user_dir)
    try:
        parsed = [OverridesParser.create().parse_override(o) for o in overrides]
    except HydraException:  # not an override Hydra can parse: its own message
        return copy.deepcopy(whole())
    if any(_must_be_composed(o) and not _chooses(o) for o in parsed):
        return copy.deepcopy(whole())  # a +, ++, ~ or sweep: Hydra applies it in order with the values
    tree = tuple(o.input_line for o in parsed if _must_be_composed(o))
    config = copy.deepcopy(_compose_once(tree, config_name, config_dir, user_dir))
    try:
        for override in (o for o in parsed if not _must_be_composed(o)):
            OmegaConf.update(config, override.key_or_group, override.value(), merge=True)
    except OmegaConfBaseException:  # Hydra's own error (and message) for it
        return copy.deepcopy(whole())
    config.hydra.overrides.task = [o.input_line for o in parsed if not o.is_hydra_override()]
    return config


def _chooses(override: Override) -> bool:
    """Whether ``override`` picks a group's option or sets a hydra key (``optim=adam``, ``hydra/launcher=slurm``)."""
    key = override.key_or_group
    return override.is_hydra_override() or "/" in key or ("." not in key and key in GROUPS_OF_CONF)


def _must_be_composed(override: Override) -> bool:
    """Whether Hydra must compose ``override`` itself: a choice, an addition or deletion, a sweep;
    not a plain ``key=value`` of the composed config."""
    changes_keys = override.is_add() or override.is_force_add() or override.is_delete()
    return changes_keys or override.is_sweep_override() or _chooses(override)


#: The config groups of the shipped tree (a user's dir adds options to them, not groups).
GROUPS_OF_CONF = frozenset(path.name for path in CONF_DIR.iterdir() if path.is_dir())


@functools.cache
def _compose_once(overrides: tuple[str, ...], config_name: str, config_dir: Path, user_dir: Path | None) -> DictConfig:
    """One single-run composition with its hydra node, made once per distinct call (an error each time)."""
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="train"):
        return _compose(overrides, config_name, user_dir, RunMode.RUN)


def _compose(overrides: Sequence[str], config_name: str, user_dir: Path | None, mode: RunMode) -> DictConfig:
    """The command's config as Hydra's ``run`` (or ``multirun``) composes it; Hydra initialised."""
    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    return hydra.compose_config(config_name, [*_with_user_dir(overrides, user_dir), f"hydra.mode={mode.name}"], mode)


@contextlib.contextmanager
def _as_config_error() -> Iterator[None]:
    """A composition error as the ConfigError ``train.py`` prints (one line)."""
    try:
        yield
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError([describe_hydra_error(error)]) from None


def _with_user_dir(overrides: Sequence[str], user_dir: Path | None) -> list[str]:
    """``--config-dir`` as the first entry of ``hydra.searchpath`` (the Compose API has no such flag)."""
    if user_dir is None:
        return list(overrides)
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
