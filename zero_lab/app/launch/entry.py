"""The console entry point: ``zero-lab-train`` (installed) and ``python train.py`` (checkout).

    zero-lab-train -m optim=adam,zero_adam dist.world_size=2,4

The configs come from the package (``pkg://zero_lab.conf``), so an installed wheel runs the same
job as a checkout. Hydra composes the command's config once; its callbacks check it
(:mod:`zero_lab.app.check.callback`) and claim the run dir (:mod:`zero_lab.app.launch.run_dir`)
before Hydra creates anything. Before Hydra starts, the schemas of the user's own YAMLs are
registered: their dirs (``--config-dir``, ``hydra.searchpath=[...]``) read with Hydra's own parser.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.main import get_args_parser  # the parser @hydra.main reads sys.argv with
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.check.before_start import fail
from zero_lab.app.check.callback import composed
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.config.paths import CONF_PACKAGE
from zero_lab.app.config.problems import describe_hydra_error
from zero_lab.app.config.schema import register_configs
from zero_lab.app.launch.task import Objective, run
from zero_lab.runtime.signals import Stopped, stopping_raises

__all__ = ["main", "user_config_dirs"]

#: Hydra's switch: raise what a command fails of instead of printing it (Hydra's ``run_and_report``).
FULL_ERROR = "HYDRA_FULL_ERROR"


@hydra.main(config_path=CONF_PACKAGE, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> Objective | None:
    return run(cfg)


def main() -> None:
    """Register the schemas of ours and the user's configs, then run Hydra; a config Hydra
    cannot compose is one line, ``zero_lab: ...``, and exit code 2, as every config problem.
    SIGTERM / SIGINT before the ranks run or after they are done (composing, checking, finishing)
    is one line too, ``zero_lab: stopped by SIGTERM while <doing>; <what was kept>``, and exit
    code 128 + the signal (:class:`~zero_lab.runtime.signals.Stopped`; cleanup runs on the way)."""
    try:
        with stopping_raises("composing and checking the config") as stage:
            _main()
            stage.now("exiting", "the run had finished, everything was kept")
    except Stopped as stopped:
        fail(stopped, 128 + stopped.signum)


def _main() -> None:
    args = get_args_parser().parse_args()
    try:
        register_configs(extra_dirs=user_config_dirs(args.overrides, args.config_dir))
    except HydraException:  # a malformed hydra.searchpath: Hydra's composition names it
        register_configs()
    if os.environ.get(FULL_ERROR) == "1":  # the user asked for Hydra's full report
        _hydra_main()
        return
    os.environ[FULL_ERROR] = "1"  # Hydra raises what it cannot compose to here instead of printing it
    try:
        _hydra_main()
    except (HydraException, OmegaConfBaseException) as error:
        if composed():  # a job's own error, after its config was composed: raised with its full traceback
            raise
        fail(ConfigError([describe_hydra_error(error)]))


def user_config_dirs(overrides: Sequence[str], config_dir: str | None = None) -> list[Path]:
    """The user's config dirs, in Hydra's search order: ``--config-dir``, then the entries of a
    ``hydra.searchpath=[...]`` override (``file://<dir>``, ``pkg://<module>`` or a plain path)."""
    found = [Path(config_dir).expanduser().resolve()] if config_dir else []
    for override in OverridesParser.create().parse_overrides([o for o in overrides if "searchpath" in o]):
        if override.get_key_element() == "hydra.searchpath":
            dirs = (_search_path_dir(str(entry)) for entry in override.value() or [])
            found += [where for where in dirs if where is not None]
    return found


def _search_path_dir(entry: str) -> Path | None:
    if entry.startswith("pkg://"):
        spec = importlib.util.find_spec(entry.removeprefix("pkg://").replace("/", "."))
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    return Path(entry.removeprefix("file://")).expanduser().resolve()
