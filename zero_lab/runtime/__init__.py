"""Process plumbing, apart from the algorithm: start a world of ranks and stop it cleanly.

``spawn`` (zero_lab starts a job's ranks itself: fork them, forward signals, name the failed
rank), ``signals`` (stop after the current step on SIGTERM/SIGINT/SIGUSR2), ``external`` (ranks
a *runner* started, each as its own process — torchrun, srun: one run dir and one config for
them), ``slurm`` (a task's world from ``SLURM_*``), ``heartbeat`` (stall detection).
Depends on torch and the core only; the Hydra app builds on it.

Three words, one meaning each: a *launcher* is Hydra's (``hydra/launcher=``: what runs a sweep's
jobs, ``zero_lab.app.launch.slurm`` among them), a *runner* starts ranks from outside
(``ExternalRunner``), and a job *spawns* its own ranks (:func:`zero_lab.runtime.spawn.run_world`).
"""
