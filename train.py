"""zero_lab's entry point: ZeRO-1 data-parallel training, every part chosen with Hydra.

    python train.py                                   # embedded default: ZeRO-Adam, 2 CPU ranks
    python train.py optim=adam dist.world_size=4      # plain DDP + Adam baseline on 4 ranks
    python train.py -m optim=adam,zero_adam dist.world_size=1,2
    torchrun --nproc_per_node 2 train.py optim=zero_adam

The same job is ``zero-lab-train`` once the package is installed; both run
:func:`zero_lab_train.main` (a SIGTERM or Ctrl-C while torch loads is one line, not a silent
death). The loop lives in ``zero_lab.app`` (importable, testable); this file only calls its
entry point. Ranks start inside the Hydra job (one run dir per job); under torchrun each process
is one rank.
"""

if __name__ == "__main__":
    from zero_lab_train import main  # the standard library only: it guards stop signals while torch loads

    main()
