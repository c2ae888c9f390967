"""Every module of the flat ``zero_lab.app`` still imports by its old name, as the same object.

Configs in users' hands name ``_target_: zero_lab.app.data.RegressionData`` or
``zero_lab.app.models.MLP``; code imports ``zero_lab.app.sinks`` or ``zero_lab.app.protocols``.
:data:`zero_lab.app.MOVED` is the one table of old names; a finder answers them.
"""

from __future__ import annotations

import importlib
import pickle
import sys

import pytest
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

import zero_lab.app
from zero_lab.app import MOVED

#: The modules of the flat layout (git show ea0fc07:zero_lab/app) but preflight (now tests/preflight.py).
FLAT = (
    "build", "cli", "closing", "config_check", "config_problems", "data", "dcp_checkpoints", "entry",
    "failure_text", "grad_checks", "grad_reach", "hf_models", "hydra_errors", "main", "memory", "metrics",
    "models", "objective", "optim_plan", "paths", "progress", "protocols", "provenance",
    "rank_errors", "repeats", "requeue", "run_checkpoints", "rundir", "runner", "scheduler_check", "schema",
    "sinks", "slurm_launcher", "step", "summary", "targets", "torch_extras", "training", "validate", "wandb_run",
)  # fmt: skip


def test_the_table_names_every_module_of_the_flat_layout_and_each_new_home_exists() -> None:
    assert sorted(MOVED) == sorted(FLAT)
    assert len(set(MOVED.values())) == len(MOVED)
    for new in MOVED.values():
        assert importlib.util.find_spec(f"zero_lab.app.{new}") is not None, new


@pytest.mark.parametrize("old", FLAT)
def test_an_old_name_imports_the_same_module_object(old: str) -> None:
    moved = importlib.import_module(f"zero_lab.app.{old}")
    module = importlib.import_module(f"zero_lab.app.{MOVED[old]}")
    assert moved is module
    assert sys.modules[f"zero_lab.app.{old}"] is module
    assert module.__name__ == module.__spec__.name == f"zero_lab.app.{MOVED[old]}"  # its own spec kept
    assert getattr(zero_lab.app, old) is module  # ``from zero_lab.app import <old>``


def test_old_dotted_names_reach_the_same_classes_through_hydra_and_pickle() -> None:
    from zero_lab.app.record.sinks import NullSink
    from zero_lab.app.workloads.data import RegressionData as Moved

    assert importlib.import_module("zero_lab.app.data").RegressionData is Moved
    assert get_class("zero_lab.app.models.MLP") is importlib.import_module("zero_lab.app.workloads.models").MLP
    assert get_class("zero_lab.app.slurm_launcher.SlurmJobsLauncher").__module__ == "zero_lab.app.launch.slurm"
    assert get_class("zero_lab.app.config_check.CheckConfig").__module__ == "zero_lab.app.check.callback"
    assert get_class("zero_lab.app.rundir.ClaimRunDir").__module__ == "zero_lab.app.launch.run_dir"
    sink = instantiate(OmegaConf.create({"_target_": "zero_lab.app.sinks.NullSink"}))
    assert type(sink) is NullSink
    data = instantiate(
        OmegaConf.create(
            {"_target_": "zero_lab.app.data.RegressionData", "global_batch": 4, "in_dim": 3, "out_dim": 2, "seed": 0}
        )
    )
    assert type(data) is Moved and type(pickle.loads(pickle.dumps(data))) is Moved


def test_a_name_outside_the_table_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError, match=r"zero_lab\.app\.no_such_module"):
        importlib.import_module("zero_lab.app.no_such_module")
