"""What the W&B run is given, from the composed default config (no wandb import, no run)."""

from __future__ import annotations

from omegaconf import OmegaConf

from zero_lab.app.preflight import compose_job
from zero_lab.app.schema import register_configs
from zero_lab.app.wandb_run import identity, run_config

register_configs()


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
