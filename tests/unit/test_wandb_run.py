"""What the W&B run is given (group, name, tags, config), without a W&B client or a run."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from zero_lab.app.preflight import compose_job
from zero_lab.app.schema import register_configs
from zero_lab.app.wandb_run import identity, run_config

register_configs()

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


def test_the_default_logger_gets_tags_group_and_name_from_the_job():
    # logger.tags is null unless set (WandbSink's default): the job's tags are added all the same
    for extra, own in (([], []), (["logger.tags=[mine]"], ["mine"])):
        cfg, choices, _ = compose_job(["optim.lr=0.01", *extra])
        logger = OmegaConf.to_container(cfg.logger, enum_to_str=True)
        meta = {"choices": choices, "overrides": ["optim.lr=0.01", *extra], "group": "sweep-a", "name": "job0"}
        out = identity(logger, meta, world_size=2, zero=True)
        job = ["optim:zero_adam", "partitioner:sorted_greedy", "model:mlp", "world_size:2", "optim.lr:0.01"]
        assert out["tags"][: len(own) + len(job)] == [*own, *job]
        assert (out["group"], out["name"]) == ("sweep-a", "job0")
        shown = run_config({"optim": {"lr": 0.01}}, choices, out)
        assert shown["optim.lr"] == 0.01 and shown["optim"] == "zero_adam" and shown["logger.group"] == "sweep-a"
        assert "logger.notes" not in shown  # unset keys are left out
