"""What a config implies, answered once before anything is built: the run's plan.

``run_plan`` (one meta model per job: the routed parameter specs, DDP's buckets, the partition,
the memory plan; every check, the notices, the task and the Slurm launcher read it),
``optim_plan`` (which ``torch.optim`` class steps), ``strategy`` (plain DDP or ZeRO as one typed
object: clipping, settling, state, checkpoints, closing lines). Imports ``config`` and
``workloads`` of the app.
"""
