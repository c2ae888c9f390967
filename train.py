"""zero_lab's entry point: ZeRO-1 data-parallel training, every part chosen with Hydra.

    python train.py                                   # embedded default: ZeRO-Adam, 2 CPU ranks
    python train.py optim=adam dist.world_size=4      # plain DDP + Adam baseline on 4 ranks
    python train.py -m optim=adam,zero_adam dist.world_size=1,2
    torchrun --nproc_per_node 2 train.py optim=zero_adam

The loop lives in ``zero_lab.app`` (importable, testable); this file only hands Hydra's
composed config over. Ranks start inside the Hydra job (one run dir per job); under
torchrun each process is one rank.
"""

import sys

import hydra
from omegaconf import DictConfig

from zero_lab import app

app.setup()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return app.run(cfg)


if __name__ == "__main__":
    sys.argv = app.prepare(sys.argv)  # bad config: one message, exit 2; torchrun: one run dir
    main()
