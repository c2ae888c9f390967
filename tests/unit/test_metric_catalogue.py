"""One metric catalogue (zero_lab/app/record/catalogue.py): every metric's name and key are spelled
there and nowhere else in the package's writers and readers (the loop, summary, W&B, closing lines,
the report); what a step record, summary.json and W&B's summary hold matches what it says."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from zero_lab.app.record.catalogue import CATALOGUE, PER_RANK, SUMMARY_LISTS, Metric
from zero_lab.app.record.metrics import FIELDS, RankStep, step_record
from zero_lab.app.record.objective import OBJECTIVES
from zero_lab.app.record.summary import RunSummary
from zero_lab.app.record.wandb_run import run_summary

PACKAGE = Path(__file__).resolve().parents[2] / "zero_lab"
CATALOGUE_FILE = PACKAGE / "app" / "record" / "catalogue.py"
#: Names that are also ordinary words elsewhere (``output["loss"]``: a model's own loss; a param group's "lr").
ALSO_A_WORD = {"loss", "lr"}
#: The one other place allowed: the ``objective`` key's default in the schema, which sits in config/, below
#: record/ (tests/unit/test_layers.py), and names a summary field as a user's ``objective=final_loss`` does.
CONFIG_DEFAULT = ("zero_lab/app/config/schema.py", "final_loss")


def spelled(metric: Metric) -> set[str]:
    return {s for s in (metric.name, metric.key, metric.median) if s and s not in ALSO_A_WORD}


def catalogued_literals(tree: ast.AST, names: set[str], keys: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(line, literal)`` of each string constant equal to a catalogued name/key or under a key (``key/...``);
    ``__all__`` lists function names (``memory.ddp_state_bytes``), not metrics."""
    exported = {id(n) for a in ast.walk(tree) if _is_all(a) for n in ast.walk(a)}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if id(node) not in exported
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in names or node.value.startswith(tuple(f"{k}/" for k in keys)))
    ]


def _is_all(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)


def test_no_module_but_the_catalogue_spells_a_metric_name_or_key():
    names = set().union(*(spelled(m) for m in CATALOGUE))
    keys = tuple(m.key for m in CATALOGUE if m.key)
    found = {}
    for path in sorted((PACKAGE / "app").rglob("*.py")) + sorted((PACKAGE / "report").rglob("*.py")):
        module = str(path.relative_to(PACKAGE.parent))
        hits = [(line, text) for line, text in catalogued_literals(ast.parse(path.read_text()), names, keys)
                if (module, text) != CONFIG_DEFAULT]  # fmt: skip
        if path != CATALOGUE_FILE and hits:
            found[module] = hits
    assert found == {}, "take metric names and keys from zero_lab.app.record.catalogue"


def test_the_scan_finds_names_keys_and_keys_below_a_key():
    tree = ast.parse(
        'a = "optim_step_s"\nb = "time/step_s/max"\nc = "step_time_s"\nd = x["loss"]\ne = f"{k}/max"\n'
        '__all__ = ["peak_bytes"]'
    )
    names = set().union(*(spelled(m) for m in CATALOGUE))
    hits = catalogued_literals(tree, names, tuple(m.key for m in CATALOGUE if m.key))
    assert hits == [(1, "optim_step_s"), (2, "time/step_s/max"), (3, "step_time_s")]


def test_each_entry_says_where_it_shows_and_names_and_keys_are_unique():
    assert len({m.name for m in CATALOGUE}) == len(CATALOGUE)
    keys = [m.key for m in CATALOGUE if m.key]
    assert len(set(keys)) == len(keys)
    for metric in CATALOGUE:
        assert metric.shows and set(metric.shows) <= {"wandb", "summary", "closing", "report"}, metric.name
        assert metric.unit and metric.meaning, metric.name
        assert metric.key or "wandb" not in metric.shows, metric.name  # W&B shows it under its key


def test_a_step_record_holds_every_per_rank_key_and_the_step_scalars():
    ranks = [RankStep(loss=1.0, step_s=0.5, samples=4), RankStep(loss=3.0, step_s=0.25, samples=4)]
    record = step_record(3, ranks, imbalance=1.5, grad_norm=True)
    for metric in PER_RANK:
        assert {metric.at(w) for w in ("rank0", "rank1", "max", "mean")} <= record.keys()
    assert (record["train/loss"], record["train/loss/rank1"]) == (2.0, 3.0)
    assert record["time/step_s/max"] == 0.5 and record["train/samples_per_s"] == 16.0
    assert (record["memory/imbalance"], record["train/grad_norm"]) == (1.5, 0.0)
    assert {m.name for m in PER_RANK} <= set(FIELDS)


def test_summary_fields_objectives_and_wandb_summary_follow_the_catalogue():
    fields = {f.name for f in dataclasses.fields(RunSummary)}
    assert {m.median for m in CATALOGUE if m.median} <= fields
    assert {m.name for m in SUMMARY_LISTS} <= fields
    assert next(iter(OBJECTIVES)) == "final_loss" and set(OBJECTIVES) <= fields
    assert set(OBJECTIVES) == {"final_loss", "step_time_s", "exchange_time_s", "exchange_exposed_s",
                               "optim_state_bytes", "samples_per_s"}  # fmt: skip
    summary = RunSummary(final_loss=0.5, losses=[0.5], world_size=2, steps=1, optim_step_s=[0.01, 0.03], imbalance=1.2)
    shown = run_summary(summary)
    assert (shown["time/optim_step_s/max"], shown["time/optim_step_s/min"]) == (0.03, 0.01)
    assert shown["memory/imbalance"] == 1.2


@pytest.mark.parametrize("metric", [m for m in CATALOGUE if m.per_rank], ids=lambda m: m.name)
def test_per_rank_keys_are_namespaced(metric: Metric):
    assert metric.key is not None and metric.key.split("/")[0] in {"time", "comm", "memory"}
    assert metric.at("max") == f"{metric.key}/max"


def test_docs_metrics_lists_every_key_a_step_logs():
    table = (PACKAGE.parent / "docs" / "metrics.md").read_text()
    missing = [m.key for m in CATALOGUE if m.key and "wandb" in m.shows and f"`{m.key}" not in table]
    assert missing == []
