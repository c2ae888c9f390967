"""zero_lab's entry point: ZeRO-1 data-parallel training, every part chosen with Hydra.

    python train.py                                   # embedded default: ZeRO-Adam, 2 CPU ranks
    python train.py optim=adam dist.world_size=4      # plain DDP + Adam baseline on 4 ranks
    python train.py -m optim=adam,zero_adam dist.world_size=1,2
    torchrun --nproc_per_node 2 train.py optim=zero_adam

The same job is ``zero-lab-train`` once the package is installed. The loop lives in
``zero_lab.app`` (importable, testable); this file only calls its entry point. Ranks start
inside the Hydra job (one run dir per job); under torchrun each process is one rank.
"""

from zero_lab.app.launch.entry import main

if __name__ == "__main__":
    main()
