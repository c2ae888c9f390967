"""What a W&B run shows, from the composed configs (no wandb, no processes): the identity
(group, name, tags) and the filterable run config of ``logger=wandb`` as the schema fills it
in. The same files read back from real offline runs: tests/e2e/test_metrics.py."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.preflight import compose_job
from zero_lab.app.check.rules import check
from zero_lab.app.config.schema import HYDRA_KEYS
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.record.sinks import MetricSink, make_logger_sink
from zero_lab.app.record.wandb_run import identity, run_config


def _logger_and_config(overrides: list[str]) -> tuple[dict, dict, dict]:
    cfg, choices, _ = compose_job(overrides)
    logger = OmegaConf.to_container(cfg.logger, enum_to_str=True)
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return logger, config, {k: v for k, v in choices.items() if not str(k).startswith("hydra/")}


def test_the_default_wandb_logger_gets_tags_from_the_options_world_size_and_overrides():
    logger, config, choices = _logger_and_config(["param_dtype=bfloat16"])
    assert logger["tags"] is None  # the schema's default: the run's tags come from identity()
    overrides = ["param_dtype=bfloat16", "hydra.run.dir=x"]
    meta = {"choices": choices, "overrides": overrides, "group": "sweep-a", "name": "j"}
    used = identity(logger, meta, world_size=2, zero=True)
    assert used["tags"] == [
        "optim:zero_adam",
        "partitioner:sorted_greedy",
        "model:mlp",
        "world_size:2",
        "param_dtype:bfloat16",
    ]
    assert (used["group"], used["name"]) == ("sweep-a", "j")
    plain = identity({**logger, "tags": ["mine"]}, {"choices": {**choices, "optim": "adam"}}, world_size=4, zero=False)
    assert plain["tags"] == ["mine", "optim:adam", "model:mlp", "world_size:4"]  # a plain optimizer has no partitioner

    run = run_config(config, choices, {k: v for k, v in used.items() if k not in HYDRA_KEYS})
    assert (run["optim"], run["partitioner"], run["logger"], run["param_dtype"]) == (
        "zero_adam",
        "sorted_greedy",
        "wandb",
        "bfloat16",
    )
    assert run["optim.optimizer_class"] == "torch.optim.Adam"
    assert not [k for k in run if k.rsplit(".", 1)[-1] in HYDRA_KEYS]
    assert run["logger.group"] == "sweep-a" and "logger.entity" not in run  # unset keys left out, not <nil>


class OwnSink:
    """A metric sink of the user's: it takes the run dir and a key of its own, nothing of W&B's."""

    def __init__(self, run_dir: str, prefix: str = "step"):
        self.run_dir, self.prefix, self.lines = run_dir, prefix, []

    def log(self, record):
        self.lines.append(f"{self.prefix} {record['step']}")

    def summary(self, summary):
        pass

    def close(self, failed=False):
        pass


def test_a_sink_of_your_own_is_handed_only_what_its_constructor_takes(tmp_path):
    """W&B's group, name and tags, and the run config, go to a sink that takes them; a sink
    without ``**kwargs`` used to fail at start with "unexpected keyword argument 'group'"."""
    overrides = ["logger=none", f"logger._target_={__name__}.OwnSink", "+logger.prefix=at"]
    cfg, choices, _ = compose_job(overrides)
    check(cfg, choices)
    meta = {"choices": choices, "overrides": overrides, "group": "sweep-a", "name": "j"}
    sink = make_logger_sink(cfg, tmp_path, {}, meta, OptimPlan.of(cfg.optim))
    assert isinstance(sink, OwnSink) and isinstance(sink, MetricSink)
    sink.log({"step": 3})
    assert (sink.run_dir, sink.lines) == (str(tmp_path), ["at 3"])
    wandb, _, _ = _logger_and_config([])
    assert identity(wandb, meta, 2, True)["group"] == "sweep-a"  # W&B's node has the key: filled in
    assert "group" not in identity({"_target_": f"{__name__}.OwnSink", "prefix": "at"}, meta, 2, True)
