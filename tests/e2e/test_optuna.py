"""Optuna through the real ``python train.py -m experiment=optuna_zero``: the study's
``optimization_results.yaml`` holds exactly the objective values the trials wrote to their
summary.json, for the parameters they really ran with. The module's commands are independent
and run together, two at a time."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.e2e.runs import assert_no_leftover_processes, summary, together, train


def study(tmp_path: Path, *overrides: str) -> tuple[dict[str, Any], list[Path]]:
    """A 2-trial, 3-step study of the documented experiment; its results and trial dirs."""
    result = train(
        "-m", "experiment=optuna_zero", "hydra.sweeper.n_trials=2", "steps=3", *overrides, f"hydra.sweep.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    trials = sorted((p for p in tmp_path.iterdir() if p.is_dir()), key=lambda p: int(p.name))
    assert [p.name for p in trials] == ["0", "1"]
    return OmegaConf.to_container(OmegaConf.load(tmp_path / "optimization_results.yaml")), trials


def ran_with(trial: Path) -> dict[str, Any]:
    """The searched parameters as the trial's run really resolved them."""
    cfg, ran = OmegaConf.load(trial / ".hydra" / "config.yaml"), summary(trial)
    return {"optim.lr": cfg.optim.lr, "partitioner": ran["choices"]["partitioner"], "bucket_view": ran["bucket_view"]}


MULTI = ("objective=[final_loss,optim_state_bytes]", "hydra.sweeper.direction=[minimize,minimize]")
MISMATCHED = ("-m", "experiment=optuna_zero", "objective=[final_loss,step_time_s]")  # 2 objectives, 1 direction


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Any]:
    """The module's three commands, independent, run together (two at a time): the single- and
    the multi-objective study (results and trial dirs), and the mismatched one (its result and sweep dir)."""
    base = tmp_path_factory.mktemp("optuna")
    single, multi, mismatched = together(
        functools.partial(study, base / "single"),
        functools.partial(study, base / "multi", *MULTI),
        functools.partial(train, *MISMATCHED, f"hydra.sweep.dir={base / 'mismatched'}"),
    )
    return {"single": single, "multi": multi, "mismatched": (mismatched, base / "mismatched")}


def test_single_objective_study_reports_the_best_final_loss_the_runs_wrote(made):
    results, trials = made["single"]
    losses = [summary(trial)["final_loss"] for trial in trials]
    assert results["best_value"] == min(losses)  # exactly the float the run wrote
    best = trials[losses.index(min(losses))]
    assert results["best_params"] == ran_with(best)
    assert len({ran_with(trial)["optim.lr"] for trial in trials}) == 2  # the sampler varied the lr
    assert_no_leftover_processes()


def test_multi_objective_study_reports_a_pareto_front_of_the_runs_values(made):
    results, trials = made["multi"]
    written = {
        tuple(sorted(ran_with(t).items())): [summary(t)["final_loss"], max(summary(t)["optim_state_bytes"])]
        for t in trials
    }
    assert results["solutions"]
    for solution in results["solutions"]:
        assert solution["values"] == written[tuple(sorted(solution["params"].items()))]


def test_objectives_and_directions_of_different_lengths_stop_before_any_trial_trains(made):
    result, sweep_dir = made["mismatched"]
    assert result.returncode == 2
    assert "hydra.sweeper.direction=[minimize,minimize]" in result.stderr
    assert not list(sweep_dir.glob("*/summary.json")) and not list(sweep_dir.glob("*/logs"))
