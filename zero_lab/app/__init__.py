"""The Hydra app behind ``train.py``: config schemas, checks, the rank loop, metrics, sinks.

    python train.py optim=zero_adam          # zero_lab.app.entry.main: Hydra, checked by a callback
    zero-lab-train optim=zero_adam           # the same, installed

Modules, one job each: ``schema`` (typed plain keys; group schemas derived from the
constructors), ``validate`` (builds and runs the real objects; ranges and combinations),
``entry`` (the console entry point), ``config_check`` (a Hydra callback: every job's composed
config checked before anything is created; ``hydra_errors`` words Hydra's own errors;
``config_problems`` folds derived failures into one line each), ``cli``
(one-line failures; torchrun/srun ranks share one run dir), ``rundir`` (a Hydra callback: one
run dir per job, claimed before anything is written), ``main`` (the Hydra task),
``failure_text`` / ``provenance`` / ``requeue`` (what a failed job says, meta.json, a requeued
job's resume), ``repeats`` (a sweep job repeating an earlier one is not run), ``preflight``
(compose and check without running: for tests and tools),
``build`` (model -> DDP -> optimizer), ``runner`` (the rank loop), ``data`` / ``models``
(synthetic tasks), ``metrics`` (one gather per step), ``sinks`` (metrics.jsonl, W&B) /
``wandb_run`` (what the W&B run shows), ``checkpoint`` (the run's checkpoints and what a
resume checks), ``progress``, ``paths`` (where the configs are), ``objective`` (what a job
returns to its sweeper).
"""
