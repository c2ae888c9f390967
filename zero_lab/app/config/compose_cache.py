"""Make Hydra's repeated compositions cheaper, with the same result: work each one redid or dropped.

A process composes many times: a ``-m`` sweep composes every job to check it, an Optuna study
composes each trial, and the config tests compose a few hundred command lines. Each Hydra 1.3
composition did three things whose result was already known or never read:

* **a deep copy of the ConfigStore.** Hydra copies its config repository for every composition
  (``CachingConfigRepository``, so that search-path overrides leave the original's list of
  sources alone), and with it the ``ConfigStore`` singleton that its structured-config source
  holds: every schema stored, Hydra's and each option's here (a quarter of a composition).
  :func:`share_the_config_store` makes a copy of the store the store itself. That protects
  nothing that needs protecting: the store is written only by ``ConfigStore.store`` and read
  only through ``ConfigStore.load``, which deep-copies the node it returns.
* **the YAML parse of every config file.** :func:`cache_yaml_parses` keeps each file's parse
  (plain dicts, lists and scalars) keyed by its full text: the file is still read on every load
  (microseconds), so an edit is seen at once, and only its parse (milliseconds) is reused. Each
  load builds a fresh ``DictConfig`` from a copy of the parse, as Hydra's own
  ``FileConfigSource.load_config`` builds one from a fresh parse: callers may change it freely.
* **an interpolation map per config of the defaults tree.** For each config it expands, Hydra
  builds a ``DictConfig`` of the choices known so far, which it reads only to resolve that
  config's interpolated defaults (``- optional derived/optim@optim: ${optim}``). Only
  ``config.yaml`` has any; for the twenty-odd others it was built and dropped (a tenth of a
  composition). :func:`skip_unused_interpolation_maps` builds it only for a config that has one.

:func:`speed_up_compositions` installs all three, each idempotent; the two that replace Hydra's
private functions do so only on the Hydra series they were written against (:data:`HYDRA_SERIES`).
Within ``with hydra_alone():`` Hydra composes as it does without this module: to compare, or to
rule this module out when a composition surprises. ``tests/unit/test_config_store.py`` holds what
makes each safe and compares compositions both ways; ``scripts/compose_time.py`` times them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import hydra
import yaml
from hydra._internal import defaults_list
from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

__all__ = [
    "cache_yaml_parses",
    "file_config_source",
    "hydra_alone",
    "share_the_config_store",
    "skip_unused_interpolation_maps",
    "speed_up_compositions",
]


#: The Hydra releases whose private internals the YAML cache and the interpolation maps were
#: written against and compared with (tests/unit/test_config_store.py); on another, Hydra is left as it is.
HYDRA_SERIES = "1.3."


def speed_up_compositions() -> None:
    """Share the ConfigStore; on Hydra 1.3, also cache the config files' YAML parses and build
    only the interpolation maps that are read (each idempotent)."""
    share_the_config_store()
    if hydra.__version__.startswith(HYDRA_SERIES):
        cache_yaml_parses()
        skip_unused_interpolation_maps()


def share_the_config_store() -> None:
    """Make a deep copy of Hydra's ``ConfigStore`` the store itself (idempotent)."""
    if "__deepcopy__" not in vars(ConfigStore):
        ConfigStore.__deepcopy__ = _the_store_itself  # type: ignore[attr-defined]


def cache_yaml_parses() -> None:
    """Load config files through :func:`_load_config_file`, which reuses an unchanged file's parse
    (idempotent)."""
    source = file_config_source()
    if source.load_config is not _load_config_file:
        _HYDRAS.setdefault(source, source.load_config)
        source.load_config = _load_config_file  # type: ignore[method-assign]


def file_config_source() -> type[ConfigSource]:
    """The class Hydra loads ``file://`` configs with. Hydra's plugin scan (once per process, at
    its first composition) executes its core plugins' modules again, so the class in use is the
    one its sources registry holds after the scan, not the one an earlier import gave."""
    Plugins.instance()  # the scan, if it has not run yet
    return SourcesRegistry.instance().resolve("file")


def skip_unused_interpolation_maps() -> None:
    """Have Hydra build a config's interpolation map only where the config has an interpolated
    default (idempotent)."""
    if defaults_list._create_interpolation_map is not _interpolation_map_if_read:
        _HYDRAS.setdefault(defaults_list, defaults_list._create_interpolation_map)
        defaults_list._create_interpolation_map = _interpolation_map_if_read


@contextlib.contextmanager
def hydra_alone() -> Iterator[None]:
    """Hydra's own behaviour for the duration: the store deep-copied per composition, a parse per
    file load, a map per config. What was installed before is installed again on leaving."""
    source = file_config_source()
    store_copy = vars(ConfigStore).get("__deepcopy__")
    load, interpolation_map = source.load_config, defaults_list._create_interpolation_map
    if store_copy is not None:
        del ConfigStore.__deepcopy__  # type: ignore[attr-defined]
    source.load_config = _HYDRAS.get(source, load)  # type: ignore[method-assign]
    defaults_list._create_interpolation_map = _HYDRAS.get(defaults_list, interpolation_map)
    try:
        yield
    finally:
        if store_copy is not None:
            ConfigStore.__deepcopy__ = store_copy  # type: ignore[attr-defined]
        source.load_config = load  # type: ignore[method-assign]
        defaults_list._create_interpolation_map = interpolation_map


def _interpolation_map_if_read(overrides: Any, defaults: list[Any], *rest: Any) -> DictConfig:
    """Hydra's map where ``defaults`` (a config's defaults list, after the overrides) holds an
    interpolated default, the only thing Hydra reads it for; else an empty config, never read."""
    if any(default.is_interpolation() for default in defaults):
        return _HYDRAS[defaults_list](overrides, defaults, *rest)
    return OmegaConf.create()


#: Hydra's own function where a speed-up replaced one: the file source class's ``load_config``,
#: the ``defaults_list`` module's ``_create_interpolation_map``.
_HYDRAS: dict[object, Callable[..., Any]] = {}


def _the_store_itself(store: ConfigStore, memo: dict[int, Any]) -> ConfigStore:
    return store


def _load_config_file(self: ConfigSource, config_path: str) -> ConfigResult:
    """``FileConfigSource.load_config`` with the parse of an unchanged file reused: the same
    path resolution, error, header and ``ConfigResult``; the config built from a copy of the parse."""
    full_path = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
    if not os.path.exists(full_path):
        raise ConfigLoadError(f"Config not found : {full_path}")
    with open(full_path, encoding="utf-8") as file:
        text = file.read()
    header, parsed = _parse(text)
    config = OmegaConf.create() if parsed is None else OmegaConf.create(copy.deepcopy(parsed))
    return ConfigResult(
        config=config, path=f"{self.scheme()}://{self.path}", provider=self.provider, header=dict(header)
    )


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> tuple[dict[str, str], Any]:
    """A config file's header (Hydra reads it from the first 512 characters) and its YAML, as
    ``OmegaConf.load`` parses it (a mapping, a list, or None for an empty file), keyed by the
    text alone: a copy of the configs elsewhere (a test's, a job's) reuses the parses."""
    parsed = yaml.load(text, Loader=get_yaml_loader())
    if parsed is not None and not isinstance(parsed, (list, dict, str)):
        raise OSError(f"Invalid loaded object type: {type(parsed).__name__}")  # as OmegaConf.load
    return ConfigSource._get_header_dict(text[:512]), parsed
