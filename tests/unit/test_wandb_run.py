"""The W&B run's identity (group, name, tags) derived from the sweep, without a W&B client."""

from __future__ import annotations

import pytest

from zero_lab.app.wandb_run import identity

META = {
    "group": "multirun-2026-11-23-10-00-00",
    "name": "optim=zero_adam,dist.world_size=4",
    "choices": {"optim": "zero_adam", "partitioner": "flat", "model": "mlp"},
    "overrides": ["optim=zero_adam", "dist.world_size=4", "hydra.job.chdir=false"],
}


@pytest.mark.parametrize("tags", [None, [], ["mine"]])
def test_tags_are_the_users_then_the_strategy_the_world_size_and_the_overrides(tags):
    logger = identity({"project": "p", "group": None, "name": None, "tags": tags}, META, 4, zero=True)
    assert (logger["group"], logger["name"]) == (META["group"], META["name"])
    # each tag once (the optim override repeats a choice); hydra.* overrides are not tags
    strategy = ["optim:zero_adam", "partitioner:flat", "model:mlp", "world_size:4", "dist.world_size:4"]
    assert logger["tags"] == [*(tags or []), *strategy]


def test_a_plain_optimizer_is_not_tagged_with_a_partitioner_and_set_names_win():
    logger = identity({"group": "g", "name": "n", "tags": None}, META, 2, zero=False)
    assert (logger["group"], logger["name"]) == ("g", "n")
    assert "partitioner:flat" not in logger["tags"] and "world_size:2" in logger["tags"]


def test_a_logger_without_tags_gets_none():
    assert "tags" not in identity({"group": None, "name": None}, META, 2, zero=True)
