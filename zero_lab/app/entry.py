"""The console entry point: ``zero-lab-train`` (installed) and ``python train.py`` (checkout).

    zero-lab-train optim=zero_adam overlap=true
    zero-lab-train -m optim=adam,zero_adam dist.world_size=2,4

The configs come from the package (``pkg://zero_lab.conf``), so an installed wheel runs the
same job as a checkout. Before Hydra starts, the command is checked (a bad config: one
message, exit 2) and, under torchrun, every rank is pointed at one run dir.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from zero_lab.app.cli import prepare
from zero_lab.app.main import Objective, run
from zero_lab.app.paths import CONF_PACKAGE

__all__ = ["main"]


@hydra.main(config_path=CONF_PACKAGE, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> Objective | None:
    return run(cfg)


def main() -> None:
    """Check the command line (registering the schemas of ours and the user's configs), then hand it to Hydra."""
    sys.argv = prepare(sys.argv)
    _hydra_main()
