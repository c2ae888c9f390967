"""What ``train.py`` does before ``@hydra.main``: check the command, join an external world.

:func:`prepare` reads the command line (:func:`parse_command_line`: Hydra's documented flags),
checks every job's config (:func:`zero_lab.app.preflight.preflight`) and, under torchrun or
``srun`` with several tasks, joins the world and adds the overrides that give all ranks one run
dir (:mod:`zero_lab.runtime.external`). A bad config ends here with one message and exit code 2,
before any process starts.

    sys.argv = prepare(sys.argv)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

import torch
from hydra.errors import HydraException
from omegaconf import DictConfig

from zero_lab.app.build import enum_str
from zero_lab.app.preflight import describe_hydra_error, preflight, user_config_dirs
from zero_lab.app.schema import register_configs
from zero_lab.app.validate import ConfigError
from zero_lab.runtime import external

__all__ = ["check_external_world", "fail", "parse_command_line", "prepare", "world_size_given"]

EXIT_CONFIG = 2


def fail(error: BaseException | str, code: int = EXIT_CONFIG) -> NoReturn:
    """Print ``zero_lab: <message>`` to stderr (once per torchrun or srun world) and exit."""
    if external.rank() == 0:
        print(f"zero_lab: {error}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def parse_command_line(argv: list[str]) -> tuple[argparse.Namespace, bool]:
    """``(args, hydra_mode)``: the overrides, ``-m`` and ``--config-name`` of a ``train.py``
    command line, and whether it asks for one of Hydra's own modes (``--help``, ``--cfg``,
    ``--info``, shell completion, another primary config path, ...), where nothing is trained.
    ``--config-dir`` (a dir of the user's own YAMLs, searched after ours) is no mode: its jobs
    are checked like any other.

    The flags are those ``python train.py --help`` documents (Hydra 1.3); Hydra parses the
    command line again itself, so an unknown flag is Hydra's to report.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--multirun", "-m", action="store_true")
    parser.add_argument("--config-name", "-cn")
    for flag, short in (
        ("--help", "-h"),
        ("--hydra-help", None),
        ("--info", "-i"),
        ("--resolve", None),
        ("--version", None),
    ):
        parser.add_argument(flag, *filter(None, [short]), action="store_true")
    for flag, short in (
        ("--cfg", "-c"),
        ("--package", "-p"),
        ("--shell-completion", "-sc"),
        ("--config-path", "-cp"),
        ("--config-dir", "-cd"),
        ("--experimental-rerun", None),
    ):
        parser.add_argument(flag, *filter(None, [short]), nargs="?", const=True)
    args, _ = parser.parse_known_args(argv)
    modes = (args.help, args.hydra_help, args.info, args.version, args.cfg, args.shell_completion, args.config_path)
    return args, any(modes) or bool(args.experimental_rerun)


def prepare(argv: list[str]) -> list[str]:
    """Return ``argv`` (plus torchrun overrides); exit with one message on a bad config."""
    args, hydra_mode = parse_command_line(argv[1:])
    user_dir = str(args.config_dir) if isinstance(args.config_dir, str) else None
    try:  # the schemas of the user's own YAMLs too: their keys are their _target_'s arguments
        register_configs(extra_dirs=user_config_dirs(args.overrides, user_dir))
    except HydraException as error:  # a malformed hydra.searchpath: Hydra says it again, in full
        if not hydra_mode:
            fail(describe_hydra_error(error))
    if hydra_mode:
        return argv  # Hydra's own modes: nothing will be trained
    if (world := external.detect()) is not None:  # as under torchrun: the config check counts no ranks per core
        os.environ.setdefault("LOCAL_RANK", str(world.local_rank))
    try:
        cfg, hydra_node = preflight(
            args.overrides,
            multirun=args.multirun,
            config_name=args.config_name or "config",
            user_dir=Path(user_dir).expanduser().resolve() if user_dir else None,
        )
        world = external.detect(port=cfg.dist.master_port)
        if world is not None:
            return argv + _external_setup(cfg, hydra_node, args.overrides, args.multirun, world)
    except ConfigError as error:
        fail(error)
    return argv


def world_size_given(overrides: list[str]) -> bool:
    """Whether the command line sets ``dist.world_size`` (``+dist.world_size=`` too)."""
    return any(o.lstrip("+").startswith("dist.world_size=") for o in overrides)


def check_external_world(cfg: DictConfig, overrides: list[str], multirun: bool, world: external.ExternalWorld) -> None:
    """Refuse what cannot run when ranks come from torchrun or srun: a sweep, or a ``dist.world_size``
    given on the command line that differs from the launcher's (never two silent half-worlds)."""
    if multirun:
        raise ConfigError(
            [
                f"-m/--multirun: not supported under {world.launcher} (its world size is fixed); run sweeps as "
                "`python train.py -m ...` (ranks start inside each job) or with hydra/launcher=slurm"
            ]
        )
    if world_size_given(overrides) and cfg.dist.world_size != world.world_size:
        fix = {
            "torchrun": "drop dist.world_size or change --nproc_per_node/--nnodes",
            "srun": (
                "under srun every task is one rank: drop dist.world_size, or start one task (srun -n1) "
                f"to spawn {cfg.dist.world_size} ranks inside it"
            ),
        }[world.launcher]
        raise ConfigError(
            [
                f"dist.world_size={cfg.dist.world_size}: under {world.launcher} the world size is "
                f"{world.launcher}'s ({world.world_size}); {fix}"
            ]
        )


def _external_setup(
    cfg: DictConfig, hydra_node: DictConfig, overrides: list[str], multirun: bool, world: external.ExternalWorld
) -> list[str]:
    check_external_world(cfg, overrides, multirun, world)
    device = torch.device("cpu")
    if enum_str(cfg.dist.device) == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    return external.external_overrides(
        _rank0_run_dir(hydra_node), enum_str(cfg.dist.backend), cfg.dist.timeout_s, device, cfg.dist.master_port
    )


def _rank0_run_dir(hydra_node: DictConfig) -> str:
    """The run dir Hydra would pick (resolved here, on this clock); rank 0's is broadcast."""
    try:
        return str(hydra_node.run.dir)
    except Exception:  # an interpolation only Hydra's job context can resolve
        run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID", "run")
        return os.path.join("outputs", "external", run_id)
