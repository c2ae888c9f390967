"""Process plumbing, apart from the algorithm: start a world of ranks and stop it cleanly.

``launch`` (spawn ranks, forward signals, name the failed rank), ``signals`` (stop after the
current step on SIGTERM/SIGINT/SIGUSR2), ``external`` (one run dir and one config for ranks
torchrun or srun started), ``slurm`` (a task's world from ``SLURM_*``).
Depends on torch and the core only; the Hydra app builds on it.
"""
