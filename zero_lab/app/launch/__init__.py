"""How jobs start: the console entry point, the Hydra task, the run dir, Slurm, requeues, repeats.

``entry`` (``zero-lab-train`` / ``python train.py``), ``task`` (the Hydra task: start the
ranks, report where it went), ``run_dir`` (a Hydra callback: one run dir per job),
``slurm`` (``hydra/launcher=slurm``), ``requeue`` (a requeued job resumes), ``repeats`` (a
sweep job repeating an earlier one is not run). The top of the app: may import every folder.
"""
