"""The ``objective`` key: what a job hands its sweeper, read from summary.json; bad values are
refused before anything starts, naming the key and the allowed names."""

from __future__ import annotations

import pytest

from tests.preflight import preflight
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.record.objective import OBJECTIVES, check_directions, check_objective, objective_value

SUMMARY = {
    "final_loss": 0.25,
    "step_time_s": 0.031,
    "exchange_time_s": 0.004,
    "exchange_exposed_s": 0.001,
    "optim_state_bytes": [3_153_936, 3_152_916],
    "samples_per_s": 1032.0,
}


def test_one_name_gives_a_float_and_a_list_gives_one_value_per_name():
    assert objective_value(SUMMARY, "final_loss") == 0.25
    assert objective_value(SUMMARY, "optim_state_bytes") == 3_153_936.0  # the fullest rank
    assert objective_value(SUMMARY, ["step_time_s", "optim_state_bytes", "samples_per_s"]) == [
        0.031,
        3_153_936.0,
        1032.0,
    ]
    assert objective_value(SUMMARY, ["exchange_time_s"]) == 0.004  # one name: a float, as one direction needs


def test_every_objective_reads_a_key_the_summary_has():
    for name in OBJECTIVES:
        assert isinstance(objective_value(SUMMARY, name), float)


def test_bad_objectives_are_named():
    assert check_objective("final_loss") == [] and check_objective(["final_loss", "step_time_s"]) == []
    (problem,) = check_objective(["final_loss", "loss"])
    assert "'loss'" in problem and "final_loss, step_time_s" in problem
    (problem,) = check_objective(3)
    assert problem.startswith("objective=3:") and "objective=[final_loss,step_time_s]" in problem


def test_optuna_directions_must_match_the_number_of_objectives():
    assert check_directions("final_loss", "minimize") == []
    assert check_directions(["final_loss", "step_time_s"], ["minimize", "minimize"]) == []
    (problem,) = check_directions(["final_loss", "step_time_s"], "minimize")
    assert "hydra.sweeper.direction=[minimize,minimize]" in problem


@pytest.mark.parametrize(
    ("override", "fragment"),
    [("objective=loss", "unknown 'loss'"), ("objective=[final_loss,bytes]", "unknown 'bytes'")],
)
def test_preflight_refuses_an_unknown_objective(override, fragment):
    with pytest.raises(ConfigError) as caught:
        preflight([override])
    (problem,) = caught.value.problems
    assert problem.startswith("objective") and fragment in problem and "optim_state_bytes" in problem


def test_an_optuna_sweep_is_checked_on_its_fixed_overrides():
    """interval() cannot be expanded before Hydra starts: the fixed part is still checked."""
    cfg, _ = preflight(["hydra/sweeper=optuna", "optim.lr=interval(1e-4,1e-2)", "steps=3"], multirun=True)
    assert cfg.steps == 3
    with pytest.raises(ConfigError, match=r"dist\.world_size=0"):
        preflight(["hydra/sweeper=optuna", "optim.lr=interval(1e-4,1e-2)", "dist.world_size=0"], multirun=True)
