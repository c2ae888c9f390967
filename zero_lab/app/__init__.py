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

Modules moved here from the flat ``zero_lab.app`` keep their old names: ``zero_lab.app.data``
is ``zero_lab.app.workloads.data`` (the same module object), so a config with
``_target_: zero_lab.app.data.RegressionData`` or code importing ``zero_lab.app.sinks`` works
unchanged. :data:`MOVED` is the one table of old names; a finder on ``sys.meta_path``
answers them, importing nothing until one is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["MOVED"]

#: ``zero_lab.app.<old>`` -> ``zero_lab.app.<new>``: the modules of the flat layout, by their new place.
MOVED: dict[str, str] = {
    "protocols": "workloads.protocols",
    "models": "workloads.models",
    "hf_models": "workloads.hf_models",
    "data": "workloads.data",
    "torch_extras": "workloads.torch_extras",
    "paths": "config.paths",
    "schema": "config.schema",
    "targets": "config.targets",
    "hydra_errors": "config.hydra_errors",
    "config_problems": "config.problems",
    "optim_plan": "plan.optim_plan",
    "summary": "record.summary",
    "metrics": "record.metrics",
    "closing": "record.closing",
    "failure_text": "record.failure_text",
    "provenance": "record.provenance",
    "wandb_run": "record.wandb_run",
    "sinks": "record.sinks",
    "progress": "record.progress",
    "objective": "record.objective",
    "training": "run.training",
    "build": "run.build",
    "step": "run.step",
    "runner": "run.rank_loop",
    "grad_reach": "run.grad_reach",
    "rank_errors": "run.rank_errors",
    "memory": "run.memory",
    "run_checkpoints": "run.checkpoints",
    "dcp_checkpoints": "run.dcp_checkpoints",
    "validate": "check.rules",
    "scheduler_check": "check.scheduler",
    "grad_checks": "check.grad_modes",
    "config_check": "check.callback",
    "cli": "check.before_start",
    "entry": "launch.entry",
    "main": "launch.task",
    "rundir": "launch.run_dir",
    "slurm_launcher": "launch.slurm",
    "requeue": "launch.requeue",
    "repeats": "launch.repeats",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``zero_lab.app.<old>`` with the module now at ``zero_lab.app.<new>`` (one object, two names)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import system sets ``__spec__`` to the old name's
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was loaded under its new name); its own spec put back."""
        assert module.__spec__ is not None
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
