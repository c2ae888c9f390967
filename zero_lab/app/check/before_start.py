"""What a job says and does before it trains: one-line failures; under torchrun or srun, one world.

:func:`fail` is how every check ends a job: ``zero_lab: <message>`` on stderr once per world, exit
code 2. Under torchrun or ``srun`` every process is one rank running the Hydra job itself: the
check callback refuses what cannot run there (:func:`check_external_world`), then
:func:`share_run_dir` gives every rank rank 0's run dir (:mod:`zero_lab.runtime.external`).
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from typing import NoReturn

import torch
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.check.rules import ConfigError
from zero_lab.app.config.overrides import given
from zero_lab.app.config.schema import enum_str
from zero_lab.runtime import external

__all__ = ["check_external_world", "fail", "share_run_dir", "world_size_given"]

EXIT_CONFIG = 2


def fail(error: BaseException | str, code: int = EXIT_CONFIG) -> NoReturn:
    """Print ``zero_lab: <message>`` to stderr (once per torchrun or srun world) and exit."""
    if external.rank() == 0:
        print(f"zero_lab: {error}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def world_size_given(overrides: list[str]) -> bool:
    """Whether the command line sets ``dist.world_size`` (``+dist.world_size=`` too)."""
    return given(overrides, "dist.world_size")


def check_external_world(cfg: DictConfig, overrides: list[str], multirun: bool, world: external.ExternalWorld) -> None:
    """Refuse what cannot run when ranks come from torchrun or srun: a sweep, or a ``dist.world_size``
    given on the command line that differs from the runner's (never two silent half-worlds)."""
    if multirun:
        problem = (
            f"-m/--multirun: not supported under {world.runner} (its world size is fixed); run sweeps as "
            "`python train.py -m ...` (ranks start inside each job) or with hydra/launcher=slurm"
        )
    elif world_size_given(overrides) and cfg.dist.world_size != world.world_size:
        fix = external.runner_named(world.runner).world_size_fix(cfg.dist.world_size)
        problem = (
            f"dist.world_size={cfg.dist.world_size}: under {world.runner} the world size is "
            f"{world.runner}'s ({world.world_size}); {fix}"
        )
    else:
        return
    raise ConfigError([problem])


def share_run_dir(config: DictConfig, world: external.ExternalWorld) -> None:
    """Join the world and point this rank's Hydra job (``config``, as Hydra composed it, before
    the run dir exists) at rank 0's run dir; a rank > 0 writes no ``.hydra/`` and no job log."""
    device = torch.device("cpu")
    if enum_str(config.dist.device) == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    run_dir = external.shared_run_dir(
        _rank0_run_dir(config, world),
        enum_str(config.dist.backend),
        config.dist.timeout_s,
        device,
        config.dist.master_port,
    )
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.run.dir = run_dir
        if world.rank > 0:  # what FOLLOWER_OVERRIDES say, on the composed config
            config.hydra.output_subdir = None
            disabled = importlib.resources.files("hydra.conf").joinpath("hydra", "job_logging", "disabled.yaml")
            config.hydra.job_logging = OmegaConf.create(disabled.read_text())  # Hydra's own option, as shipped


def _rank0_run_dir(config: DictConfig, world: external.ExternalWorld) -> str:
    """The run dir Hydra would pick (resolved here, on this clock); rank 0's is broadcast."""
    try:
        return str(config.hydra.run.dir)
    except OmegaConfBaseException:  # an interpolation only Hydra's job context can resolve
        return os.path.join("outputs", "external", world.run_id)
