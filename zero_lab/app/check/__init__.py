"""The check of a composed config before any process starts: every problem at once.

``rules`` (ranges, combinations, the real constructors' signatures), ``grad_modes``
(``grad_reduce=`` / ``shard_grads=``), ``scheduler`` (the LR scheduler, by torch's classes),
``callback`` (the Hydra callback that checks each job before Hydra creates anything),
``preflight`` (compose and check without running: for tests and tools), ``before_start``
(one-line failures; under torchrun or srun, one world). Imports every folder but ``launch``.
"""
