"""What a job returns to its sweeper: the ``objective`` key, read from the run's summary.json.

``objective`` names one measurement of :data:`OBJECTIVES` (a float is returned) or a list of
several (a list, for a multi-objective study with one ``hydra.sweeper.direction`` each), which
Optuna (``hydra/sweeper=optuna``) minimises or maximises. Every value is one summary.json holds,
so a study's results can be checked against the runs' own files::

    python train.py -m experiment=optuna_zero objective=[final_loss,optim_state_bytes] \
        'hydra.sweeper.direction=[minimize,minimize]'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zero_lab.app.record.catalogue import CATALOGUE, FINAL_LOSS
from zero_lab.app.record.summary import RunSummary

__all__ = ["OBJECTIVES", "check_directions", "check_objective", "objective_names", "objective_value"]

#: name -> what it is: the catalogue's metrics a sweeper may minimize or maximize, by their summary.json
#: field (a median's, else the metric's own); a per-rank list is read as its largest value (fullest rank).
OBJECTIVES: dict[str, str] = {
    (m.median or m.name): f"{m.meaning}{' (median)' if m.median else ''}; {m.unit}, {m.objective}"
    for m in sorted(CATALOGUE, key=lambda m: m is not FINAL_LOSS)  # final_loss first: the default
    if m.objective
}


def objective_names(objective: str | Sequence[str]) -> list[str]:
    """``"final_loss"`` -> ``["final_loss"]``; a list stays a list."""
    return [objective] if isinstance(objective, str) else [str(name) for name in objective]


def check_objective(objective: Any) -> list[str]:
    """Problems with an ``objective`` value, one line each (empty when it is valid)."""
    if not isinstance(objective, str) and not (
        isinstance(objective, Sequence) and objective and all(isinstance(n, str) for n in objective)
    ):
        return [f"objective={objective}: give one name or a list of names, e.g. objective=[final_loss,step_time_s]"]
    unknown = [name for name in objective_names(objective) if name not in OBJECTIVES]
    if unknown:
        return [f"objective: unknown {', '.join(map(repr, unknown))}; choose from: {', '.join(OBJECTIVES)}"]
    return []


def check_directions(objective: str | Sequence[str], directions: Any) -> list[str]:
    """Optuna's ``hydra.sweeper.direction`` (one, or a list) must give one direction per objective."""
    names = objective_names(objective)
    count = len(directions) if isinstance(directions, Sequence) and not isinstance(directions, str) else 1
    if count == len(names):
        return []
    wanted = "[" + ",".join(["minimize"] * len(names)) + "]" if len(names) > 1 else "minimize"
    return [
        f"objective=[{','.join(names)}]: {len(names)} value(s) but hydra.sweeper.direction has {count}; "
        f"give one direction per objective, e.g. hydra.sweeper.direction={wanted}"
    ]


def objective_value(summary: RunSummary | Mapping[str, Any], objective: str | Sequence[str]) -> float | list[float]:
    """The objective's value(s) from a run's summary: a float for one name, a list for several."""
    values = summary.as_dict() if isinstance(summary, RunSummary) else summary
    read = [values[name] for name in objective_names(objective)]
    floats = [float(max(value) if isinstance(value, list) else value) for value in read]
    return floats[0] if len(floats) == 1 else floats
