"""Config layer, in-process and fast: every option of every group composes, checks and
instantiates; every experiment composes and checks; bad input gives one message naming the
key and what is allowed; the synthetic data is the same global batch at any world size."""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from pathlib import Path

import pytest
import torch
from hydra.core.config_store import ConfigStore
from hydra.utils import get_class, get_object, instantiate
from omegaconf import OmegaConf

from tests.preflight import _compose_once, compose_job, preflight, problems
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.app.check.callback import job_config
from zero_lab.app.check.rules import ConfigError, check
from zero_lab.app.config.paths import CONF_DIR, group_options
from zero_lab.app.config.schema import FORMATS, POLICIES, Config, DistConfig, ResumeOptimizer
from zero_lab.app.launch.slurm import job_resources
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.record.objective import OBJECTIVES
from zero_lab.app.run.build import make_scheduler, optimizer_factory
from zero_lab.app.workloads.data import RegressionData, TokenData, stream_seed
from zero_lab.app.workloads.protocols import call_model, loss_of, task_of
from zero_lab.partition import ParamSpec

GROUPS = ("optim", "partitioner", "model", "data", "dist", "logger", "scheduler")
DATA_FOR_MODEL = {"mlp": "regression", "transformer": "tokens", "gpt2": "text", "llama": "text", "resnet": "images"}
MODEL_FOR_DATA = {"regression": "mlp", "tokens": "transformer", "text": "gpt2", "images": "resnet"}


def options(group: str) -> list[str]:
    return group_options(group)


def test_every_group_has_its_required_options():
    assert set(options("optim")) >= {"adam", "adamw", "sgd", "zero_adam", "zero_adamw", "zero_sgd"}
    assert set(options("partitioner")) >= {"sorted_greedy", "manual", "flat", "ddp_bucket"}
    assert set(options("model")) >= {"mlp", "transformer"}
    assert set(options("logger")) >= {"wandb", "none"}
    assert "tutorial" in options("experiment")


def _overrides_for(group: str, option: str) -> list[str]:
    overrides = [f"{group}={option}"]
    if group == "model":
        overrides.append(f"data={DATA_FOR_MODEL[option]}")
    if group == "data":
        overrides.append(f"model={MODEL_FOR_DATA[option]}")
    return overrides


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_checks_and_instantiates(group, option, single_rank_group):
    cfg, choices, _ = compose_job(_overrides_for(group, option))
    assert choices[group] == option
    if option == "cuda" and not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"dist\.device=cuda"):
            check(cfg, choices)
        return
    check(cfg, choices)
    model = instantiate(cfg.model)
    if group == "optim":
        make = optimizer_factory(cfg.optim)
        assert isinstance(make, functools.partial)
        extra = {"partitioner": instantiate(cfg.partitioner)} if option.startswith("zero_") else {}
        params = model.named_parameters() if extra else model.parameters()
        optimizer = make(params, **extra)
        assert isinstance(optimizer, ZeroRedundancyOptimizer) == option.startswith("zero_")
        assert optimizer.param_groups[0]["lr"] == cfg.optim.lr
    elif group == "partitioner":
        partitioner = instantiate(cfg.partitioner)
        specs = [ParamSpec(numel=p.numel(), name=n) for n, p in model.named_parameters()]
        partition = partitioner(specs, 2)  # manual's default `order` fits any world size
        assert sum(partition.report().numel_per_rank) == sum(s.numel for s in specs)
    elif group == "data":
        data = instantiate(cfg.data)
        x, y = data.shard(0, 0, 1)
        assert loss_of(call_model(model, x), y, data).ndim == 0  # a tensor or a ModelOutput's logits
    elif group == "logger":
        assert isinstance(instantiate(cfg.logger), functools.partial)
    elif group == "scheduler":
        scheduler = make_scheduler(cfg, torch.optim.SGD(model.parameters(), lr=0.1))
        assert (scheduler is None) == (option == "none")


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes_and_checks(experiment):
    cfg, choices, hydra_node = compose_job([f"experiment={experiment}"])
    check(cfg, choices)
    assert choices["experiment"] == experiment
    if experiment == "tutorial":
        assert (cfg.model.depth, cfg.model.hidden, cfg.model.activation) == (20, 2000, None)
        assert cfg.dist.world_size == 2 and choices["optim"] in ("adam", "zero_adam")
    if experiment == "memory_sweep":
        assert "optim" in hydra_node.sweeper.params
    if experiment in ("gpt2_text", "llama_text", "resnet"):  # the real workloads (test_workloads.py)
        assert cfg.eval_every > 0  # they evaluate on held-out data


def test_command_line_group_beats_experiment_default():
    _, choices, _ = compose_job(["experiment=tutorial", "optim=adam"])
    assert choices["optim"] == "adam"


def test_default_is_zero_adam_on_two_cpu_gloo_ranks_with_wandb_offline():
    cfg, choices, hydra_node = compose_job([])
    assert (choices["optim"], cfg.dist.world_size, str(cfg.dist.backend.value), str(cfg.dist.device.value)) == (
        "zero_adam",
        2,
        "gloo",
        "cpu",
    )
    assert (choices["logger"], str(cfg.logger.mode.value)) == ("wandb", "offline")
    assert cfg.overlap is False and cfg.bucket_view is False
    assert Path(str(hydra_node.run.dir)).parts[-3] == "outputs"


def test_each_plain_default_is_stated_once_in_the_schema():
    """A plain key's default lives in Config / DistConfig alone: config.yaml picks group options
    and sets no plain key; a dist= option sets only what DistConfig leaves to it (MISSING) or
    changes; so `python train.py --cfg job` shows the schema's value, stated nowhere else."""
    root = OmegaConf.load(CONF_DIR / "config.yaml")
    plain = [f.name for f in dataclasses.fields(Config) if f.name not in GROUPS]
    assert not [key for key in root if key in plain], "config.yaml restates a default of schema.Config"
    defaults = {f.name: f.default for f in dataclasses.fields(DistConfig)}
    for option in options("dist"):
        node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "dist" / f"{option}.yaml"))
        restated = [k for k, v in node.items() if str(getattr(defaults[k], "value", defaults[k])) == str(v)]
        assert not restated, f"dist/{option}.yaml restates DistConfig's default of {restated}"
    cfg, _, _ = compose_job([])
    for f in dataclasses.fields(Config):
        if f.name not in GROUPS and f.name != "dist":
            assert cfg[f.name] == f.default, f.name  # the composed job takes the schema's value


def test_every_option_gets_its_schema_from_the_root_config_alone():
    """config.yaml merges each group's derived schema under whatever option is picked; no option
    YAML names its schema, and the schemas are stored once, as ``derived/<group>``."""
    root_defaults = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    for group in ("optim", "partitioner", "model", "data", "logger", "scheduler"):
        assert f"optional derived/{group}@{group}" in [next(iter(d)) for d in root_defaults if not isinstance(d, str)]
    naming = [p.relative_to(CONF_DIR) for p in CONF_DIR.glob("*/*.yaml") if "/schema/" in p.read_text()]
    assert not naming, f"{naming} name their schema; config.yaml's derived/<group> line merges it already"
    stored = ConfigStore.instance().list("")
    assert {"config_schema.yaml", "derived"} <= set(stored) and "schema" not in stored
    cfg, _, _ = compose_job(["optim=sgd", "optim.momentum=0.5"])
    assert cfg.optim.dampening == 0.0 and cfg.optim.momentum == 0.5  # keys from torch.optim.SGD's signature


def test_choice_keys_take_their_values_from_the_constants_they_describe():
    assert Config.exchange == "auto"  # a registry that grows: checked when the job runs (test_registered.py)
    assert [m.value for m in ResumeOptimizer] == list(POLICIES)
    help_lines = Path(CONF_DIR / "config.yaml").read_text()
    assert not [name for name in OBJECTIVES if name in help_lines]  # objective= names OBJECTIVES, lists none


@pytest.mark.parametrize("option", options("optim"))
def test_one_plan_says_whether_an_optim_option_is_zero_and_which_class_steps(option):
    node = OmegaConf.load(CONF_DIR / "optim" / f"{option}.yaml")  # the plan reads the YAML as written
    plan = OptimPlan.of(node)
    assert plan.zero == option.startswith("zero_") == issubclass(plan.target, ZeroRedundancyOptimizer)
    wrapped = node.optimizer_class.path if "optimizer_class" in node else None  # ZeRO, ChainedOptimizer
    assert plan.optimizer_class is (get_class(wrapped) if wrapped else plan.target)
    assert issubclass(plan.optimizer_class, torch.optim.Optimizer)
    assert plan.name.split(" ")[0] == plan.optimizer_class.__name__


def test_the_docs_tables_say_what_the_code_states():
    """docs/ restates options, choices and defaults for readers: held to the one place of each."""
    docs = Path(__file__).parents[2] / "docs"
    groups = re.findall(r"^\| `(\w+)` \| (.*?) \|", (docs / "configuration.md").read_text(), re.M)
    for group, listed in groups:  # the "Config groups" table names every shipped option
        assert set(group_options(group)) <= set(re.findall(r"`(\w+)`", listed)), group
    optuna = (docs / "training.md").read_text().split("## Optuna", 1)[1]
    objectives = re.findall(r"^\| `(\w+)`", optuna.split("\n\n| `objective=`", 1)[1], flags=re.M)
    assert set(objectives) == set(OBJECTIVES)
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (.*) \|$", (docs / "checkpoints.md").read_text(), re.M)
    keys = ["checkpoint_every", "keep_checkpoints", "checkpoint_format", "resume", "resume_optimizer"]
    assert [key for key, *_ in rows] == keys
    for key, default, meaning in rows:
        expected = defaults[key].value if isinstance(defaults[key], enum.Enum) else defaults[key]
        assert default == ("null" if expected is None else str(expected)), key
        if key == "resume_optimizer":
            assert re.findall(r"`(\w+)`", meaning) == list(POLICIES)
        if key == "checkpoint_format":
            assert re.findall(r"`(\w+)`", meaning)[:2] == list(FORMATS)


BAD_INPUT = [
    (["overlap=maybe"], ["overlap=maybe", "true or false"]),
    (["dist.world_size=0"], ["dist.world_size=0", ">= 1"]),
    (["optim.lr=abc"], ["optim.lr=abc", "number"]),
    (["optim.lrr=0.1"], ["optim.lrr", "did you mean optim.lr", "weight_decay"]),
    (["ovrlap=true"], ["ovrlap", "did you mean overlap"]),
    (["optim=zero_adm"], ["optim=zero_adm", "zero_adam", "zero_sgd"]),
    (["dist.backend=ncl"], ["dist.backend=ncl", "gloo, nccl"]),
    (["optim=adam", "overlap=true"], ["overlap=true", "zero_adam"]),
    (["model=transformer"], ["data=regression", "data=tokens"]),
    (["data.global_batch=33"], ["data.global_batch=33", "multiple of dist.world_size=2"]),
    (["experiment=manual_mlp", "dist.world_size=4"], ["params_per_rank", "dist.world_size=4"]),  # 2 lists given
    (
        ["partitioner=manual", "partitioner.order=null", "partitioner.params_per_rank=[[encoder.*],[decoder.*]]"],
        ["encoder.*", "layers.0.weight"],
    ),
    (["resume=/nonexistent/run"], ["resume=/nonexistent/run", "checkpoint"]),
    (["dist.backend=nccl"], ["dist.backend=nccl", "dist.device=cuda"]),
    (["overlap_hook=sideways"], ["overlap_hook=sideways", "zero_step, interleaved"]),
    (["optim.max_grad_norm=0"], ["optim.max_grad_norm=0", "> 0", "null"]),
    (["optim.max_grad_norm=1.0", "overlap=true"], ["optim.max_grad_norm", "overlap=false"]),
    (["param_dtype=bf16"], ["param_dtype=bf16", "float32, bfloat16, float16"]),
    (
        ["partitioner=flat", "optim.optimizer_class.path=torch.optim.LBFGS"],
        ["partitioner=flat", "elementwise", "LBFGS", "partitioner=sorted_greedy"],
    ),
    (["optim=adam", "optim.master_weights=true"], ["optim.master_weights", "no such key"]),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_gives_one_message_naming_key_and_allowed(overrides, expected):
    with pytest.raises(ConfigError) as caught:
        preflight(overrides)
    message = str(caught.value)
    for fragment in expected:
        assert fragment in message, message
    assert "Traceback" not in message and "HYDRA_FULL_ERROR" not in message


def test_all_problems_are_listed_at_once():
    with pytest.raises(ConfigError) as caught:
        preflight(["steps=0", "log_every=0", "dist.world_size=3"])
    assert len(caught.value.problems) == 3  # steps, log_every, global_batch=32 vs 3 ranks


def test_sweep_checks_every_job():
    with pytest.raises(ConfigError, match=r"dist\.world_size=0"):
        preflight(["optim=adam,zero_adam", "dist.world_size=2,0"], multirun=True)
    preflight(["optim=adam,zero_adam", "steps=3"], multirun=True)


@pytest.mark.parametrize("data", [RegressionData(12, 5, 3, seed=7), TokenData(12, 11, 6, seed=7)])
def test_global_batch_is_the_same_at_any_world_size(data):
    whole = data.global_batch_at(4)
    for world in (1, 2, 3, 4):
        pieces = [data.shard(4, rank, world) for rank in range(world)]
        for index in (0, 1):
            assert torch.equal(torch.cat([p[index] for p in pieces]), whole[index])
    assert not torch.equal(data.global_batch_at(5)[0], whole[0])


def test_stream_seeds_do_not_collide():
    seeds = {stream_seed(seed, "batch", step) for seed in range(20) for step in range(200)}
    assert len(seeds) == 20 * 200


@pytest.mark.parametrize("launcher", ["slurm", "submitit_slurm", "submitit_local", "joblib"])
def test_launcher_configs_compose(launcher):
    cfg, choices, hydra_node = compose_job([f"hydra/launcher={launcher}"])
    check(cfg, choices)
    assert hydra_node.launcher._target_.startswith("hydra_plugins.")
    if launcher == "slurm":
        assert (hydra_node.launcher.tasks_per_node, hydra_node.launcher.cpus_per_task) == (1, None)  # derived:
        params = OmegaConf.to_container(hydra_node.launcher)  # unresolved: ${hydra.sweep.dir} needs a job
        assert job_resources(cfg, params) == {"cpus_per_task": cfg.dist.world_size, "gpus_per_node": None, "mem_gb": 2}
        multi = job_resources(cfg, {**params, "nodes": 2, "tasks_per_node": 2, "mem_gb": 8})
        assert multi == {"cpus_per_task": 1, "gpus_per_node": None, "mem_gb": 8}  # one rank per task; given wins


def test_the_tests_compose_a_command_line_as_hydra_does_whole():
    """tests/preflight.py composes the group choices once and applies plain values to a copy, as
    Hydra applies them: the same job config, choices and task overrides as Hydra's whole composition."""
    for overrides in (
        ["optim=sgd", "optim.momentum=0.5", "dist.world_size=4", "data.global_batch=8"],
        ["experiment=manual_mlp", "model.hidden=64", "partitioner.params_per_rank=[[a],[b]]", "steps=3"],
        ["model=transformer", "data=tokens", "optim.betas=[0.8,0.9]", "data.seq_len=${model.d_model}"],
    ):
        cfg, choices, hydra_node = compose_job(overrides)
        whole = _compose_once(tuple(overrides), "config", CONF_DIR, None)
        assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(job_config(whole))
        assert choices == OmegaConf.to_container(whole.hydra.runtime.choices)
        assert hydra_node.overrides.task == whole.hydra.overrides.task == overrides


def _task(group: str, option: str) -> str | None:
    return task_of(get_object(str(OmegaConf.load(CONF_DIR / group / f"{option}.yaml")._target_)))


@pytest.mark.parametrize("model", options("model"))
def test_every_model_runs_with_every_data_option_it_can_read(model):
    """The model's vocabulary and positions follow the data's (conf/model/*.yaml), so each pair
    of the same task passes the whole pre-start check as shipped; a data option of another task
    is refused as such."""
    readable = [data for data in options("data") if _task("data", data) == _task("model", model)]
    assert readable, f"model={model}: no shipped data option of its task"
    for data in readable:
        preflight([f"model={model}", f"data={data}"])  # the data's ids fit the embedding; a batch runs forward
    other = next(data for data in options("data") if data not in readable)
    assert f"data={other}: model={model} is a" in problems(f"model={model}", f"data={other}")
