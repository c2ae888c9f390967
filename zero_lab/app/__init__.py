"""The Hydra app behind ``train.py``, in folders by concern; each may import only those below it.

    python train.py optim=zero_adam          # zero_lab.app.launch.entry.main: Hydra, checked by a callback
    zero-lab-train optim=zero_adam           # the same, installed

From the bottom up (``tests/unit/test_layers.py`` holds the order):

* ``workloads/`` — what is trained: model and data protocols, the bundled models and data.
* ``config/`` — what a config is: the typed schema, the YAMLs' package, ``_target_``s,
  Hydra's errors worded, one problem per line.
* ``plan/`` — what a config implies, answered once per job: the run plan (one meta model,
  the specs, the partition, the memory), the optimizer plan, the DDP/ZeRO strategy.
* ``record/`` — what a run records and says: metrics, sinks, W&B, summary.json, meta.json,
  the closing lines, the sweeper's objective.
* ``run/`` — one rank's training: build, the rank loop, one step, memory, checkpoints.
* ``check/`` — the check of a composed config before any process starts, and its callback.
* ``launch/`` — how jobs start: the entry point, the Hydra task, the run dir, Slurm,
  requeues, repeats.
"""
