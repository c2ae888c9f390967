"""Compose and check a command line without running it: the library behind the config tests.

``train.py`` does not use this module: its config is composed once, by Hydra, and checked by
the callback :class:`zero_lab.app.check.callback.CheckConfig`. Here the same composition (Hydra's
Compose API, in run or multirun mode) feeds the same checks, so a test or a tool sees what
``python train.py <overrides>`` would say, without a run dir or a process:

    cfg, hydra_node = preflight(["optim=zero_adam", "dist.world_size=0"])   # raises ConfigError
    cfg, choices, hydra_node = compose_job(["optim=adam"])                # composed, not checked
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.check.callback import check_run, check_sweep, expand_sweep, job_config
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.config.hydra_errors import describe_hydra_error
from zero_lab.app.config.paths import CONF_DIR

__all__ = ["compose_job", "preflight", "sweep_jobs"]


def compose_job(
    overrides: Sequence[str],
    config_name: str = "config",
    config_dir: Path = CONF_DIR,
    user_dir: Path | None = None,
) -> tuple[DictConfig, dict[str, Any], DictConfig]:
    """Compose one job: ``(cfg without hydra, group choices, hydra node)``. ``user_dir`` is
    ``--config-dir``: searched after ``config_dir``, before any ``hydra.searchpath`` entry, as Hydra does."""
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="train"):
        full = compose(config_name=config_name, overrides=_with_user_dir(overrides, user_dir), return_hydra_config=True)
    return job_config(full), dict(OmegaConf.to_container(full.hydra.runtime.choices)), full.hydra  # type: ignore[arg-type]


def preflight(
    overrides: Sequence[str], multirun: bool = False, config_name: str = "config", user_dir: Path | None = None
) -> tuple[DictConfig, DictConfig]:
    """What ``python train.py [-m] <overrides>`` checks before it starts: compose (as Hydra's
    ``run``/``multirun`` do) and check every job; return the first job's ``(cfg, hydra node)``.
    Raises ConfigError. The schemas of the user's YAMLs (``user_dir``, ``hydra.searchpath``)
    must be registered first (:func:`zero_lab.app.config.schema.register_configs`)."""
    with _composed(overrides, multirun, config_name, user_dir) as config:
        if not multirun:
            return check_run(config), config.hydra
        first = check_sweep(config)[0]
    return job_config(first), first.hydra


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The override list of every job ``python train.py -m <overrides>`` would run
    (:func:`zero_lab.app.check.callback.expand_sweep`)."""
    with _composed(overrides, True) as config:
        return expand_sweep(config)


@contextlib.contextmanager
def _composed(
    overrides: Sequence[str], multirun: bool, config_name: str = "config", user_dir: Path | None = None
) -> Iterator[DictConfig]:
    """The command's config as Hydra's ``run`` (or ``multirun``) composes it, Hydra initialised
    meanwhile (its config loader composes a sweep's jobs); a composition error as ConfigError."""
    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        try:
            config = hydra.compose_config(
                config_name, [*_with_user_dir(overrides, user_dir), f"hydra.mode={mode.name}"], run_mode=mode
            )
        except (HydraException, OmegaConfBaseException) as error:
            raise ConfigError([describe_hydra_error(error)]) from None
        yield config


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
