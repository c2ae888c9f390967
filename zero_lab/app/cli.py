"""What ``train.py`` does before ``@hydra.main``: check the command, set up torchrun.

:func:`prepare` reads the command line with Hydra's own argument parser, checks every
job's config (:func:`zero_lab.app.preflight.preflight`) and, under torchrun, joins the
world and adds the overrides that give all ranks one run dir
(:mod:`zero_lab.runtime.torchrun`). A bad config ends here with one message and exit code 2,
before any process starts.

    sys.argv = prepare(sys.argv)
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig

from zero_lab.app.preflight import compose_job, preflight
from zero_lab.app.validate import ConfigError, enum_str
from zero_lab.runtime import torchrun

__all__ = ["fail", "prepare"]

EXIT_CONFIG = 2


def fail(error: BaseException | str, code: int = EXIT_CONFIG) -> NoReturn:
    """Print ``zero_lab: <message>`` to stderr (once per torchrun world) and exit."""
    if os.environ.get("RANK", "0") == "0":
        print(f"zero_lab: {error}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def prepare(argv: list[str]) -> list[str]:
    """Return ``argv`` (plus torchrun overrides); exit with one message on a bad config."""
    args, _ = get_args_parser().parse_known_args(argv[1:])
    if any(
        (
            args.help,
            args.hydra_help,
            args.info,
            args.cfg,
            args.shell_completion,
            args.config_path,
            args.config_dir,
            getattr(args, "experimental_rerun", None),
        )
    ):
        return argv  # Hydra's own modes: nothing will be trained
    config_name = args.config_name or "config"
    try:
        cfg = preflight(args.overrides, multirun=args.multirun, config_name=config_name)
        if torchrun.active():
            return argv + _torchrun_setup(cfg, args.overrides, args.multirun, config_name)
    except ConfigError as error:
        fail(error)
    return argv


def _torchrun_setup(cfg: DictConfig, overrides: list[str], multirun: bool, config_name: str) -> list[str]:
    if multirun:
        raise ConfigError(
            [
                "-m/--multirun: not supported under torchrun (its world size is fixed); run sweeps as "
                "`python train.py -m ...`, which starts the ranks inside each job"
            ]
        )
    world = int(os.environ["WORLD_SIZE"])
    if any(o.startswith("dist.world_size=") for o in overrides) and cfg.dist.world_size != world:
        raise ConfigError(
            [
                f"dist.world_size={cfg.dist.world_size}: under torchrun the world size is torchrun's ({world}); "
                "drop dist.world_size or change --nproc_per_node/--nnodes"
            ]
        )
    device = torch.device("cpu")
    if enum_str(cfg.dist.device) == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return torchrun.torchrun_overrides(
        _rank0_run_dir(overrides, config_name), enum_str(cfg.dist.backend), cfg.dist.timeout_s, device
    )


def _rank0_run_dir(overrides: list[str], config_name: str) -> str:
    """The run dir Hydra would pick (resolved here, on this clock); rank 0's is broadcast."""
    _, _, hydra_node = compose_job(overrides, config_name)
    try:
        return str(hydra_node.run.dir)
    except Exception:  # an interpolation only Hydra's job context can resolve
        return os.path.join("outputs", "torchrun", os.environ.get("TORCHELASTIC_RUN_ID", "run"))
