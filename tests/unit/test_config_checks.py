"""Config checks with no processes: compose with Hydra, check, read the message.

The constructors are the truth: group keys come from the ``_target_``'s signature, the real
optimizer class refuses bad hyper-parameters, the real partitioner runs on the model's
meta-device parameter specs; plus what only the app knows (finite numbers, oversubscription,
sweeps, the --multirun hint, options a plain optimizer does not use)."""

from __future__ import annotations

import ast
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf.errors import ValidationError

import zero_lab.app
from tests.preflight import compose_job, preflight, problems, sweep_jobs
from zero_lab.app.check.callback import was_checked
from zero_lab.app.check.notices import notices
from zero_lab.app.check.rules import ConfigError, check, to_container
from zero_lab.app.config.paths import CONF_DIR
from zero_lab.app.config.schema import SUPPLIED_BY_APP, register_configs
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.run import build
from zero_lab.partition import ParamSpec, Partition, Shard

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optim.lr=nan", "optim.lr=nan"),
        ("optim.lr=inf", "optim.lr=inf"),
        ("optim.eps=-inf", "optim.eps=-inf"),
        ("optim.betas=[0.9,nan]", "optim.betas.1=nan"),
        ("dist.timeout_s=inf", "dist.timeout_s=inf"),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_key(override, key):
    message = problems(override)
    assert f"{key}: must be a finite number" in message
    assert "(1 problem)" in message  # the optimizer class is not asked again about a nan


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["optim.lr=-1"], ["optim=zero_adam", "Adam refuses", "optim.lr=-1.0", "Invalid learning rate"]),
        (["optim=adam", "optim.betas=[1.5,0.9]"], ["optim.betas=[1.5, 0.9]", "Invalid beta parameter"]),
        (["optim=sgd", "optim.nesterov=true", "optim.momentum=0"], ["SGD refuses", "Nesterov"]),
    ],
)
def test_the_real_optimizer_class_checks_its_arguments(overrides, fragments):
    message = problems(*overrides)
    for fragment in fragments:
        assert fragment in message, message


def test_group_keys_come_from_the_constructor_signature():
    cfg, _, _ = compose_job(["optim=adam", "optim.eps=1e-6", "optim.amsgrad=true"])  # not in adam.yaml
    assert (cfg.optim.eps, cfg.optim.amsgrad, cfg.optim.weight_decay) == (1e-6, True, 0.0)
    zero, _, _ = compose_job(["optim=zero_sgd", "optim.dampening=0.1", "optim.master_weights=true"])
    assert (zero.optim.dampening, zero.optim.master_weights) == (0.1, True)  # SGD's and ZeRO's own
    assert "optim.amsgrad: no such key" in problems("optim=sgd", "optim.amsgrad=true")  # SGD has none
    message = problems("+optim.bogus=1")
    assert "optim.bogus: not an argument of zero_lab.ZeroRedundancyOptimizer around Adam; it takes:" in message
    assert "lr, betas, eps" in message
    assert "optim.overlap_with_ddp: given by the app at the call site" in problems("+optim.overlap_with_ddp=true")


def test_what_the_app_passes_to_the_optimizer_is_no_optim_key():
    """build.py passes these at the call site; an ``optim.<key>`` of the same name would be
    silently replaced there (``optim.exchange`` was, while ``exchange=`` decided)."""
    tree = ast.parse(Path(build.__file__).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "make_optimizer"]
    passed = {keyword.arg for call in calls for keyword in call.keywords}
    assert {"partitioner", "exchange"} <= passed <= SUPPLIED_BY_APP["optim"]
    cfg, _, _ = compose_job([])  # zero_adam: its keys come from ZeroRedundancyOptimizer's signature
    assert not passed & set(cfg.optim)
    assert "optim.exchange: given by the app at the call site" in problems("+optim.exchange=broadcast")


def test_a_new_partitioner_needs_only_its_class_and_its_yaml(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "partitioner" / "halves.yaml").write_text("_target_: tests.unit.test_config_checks.Halves\n")
    register_configs(conf)
    cfg, choices, _ = compose_job(["partitioner=halves", "partitioner.cut=0.25"], config_dir=conf)
    assert cfg.partitioner.cut == 0.25  # its argument, typed from its signature
    check(cfg, choices)
    cfg, choices, _ = compose_job(["partitioner=halves", "dist.world_size=3", "data.global_batch=3"], config_dir=conf)
    with pytest.raises(ConfigError, match=r"partitioner=halves at dist.world_size=3: Halves needs 2 ranks"):
        check(cfg, choices)
    with pytest.raises(ConfigCompositionException, match=r"partitioner.cut=most") as caught:
        compose_job(["partitioner=halves", "partitioner.cut=most"], config_dir=conf)
    assert isinstance(caught.value.__cause__, ValidationError)  # typed by its annotation, while composing


class Halves:
    """A partitioner for the test above: the first ``cut`` of the parameters to rank 0."""

    def __init__(self, cut: float = 0.5):
        self.cut = cut

    def __call__(self, specs: list[ParamSpec], world_size: int) -> Partition:
        if world_size != 2:
            raise ValueError("Halves needs 2 ranks")
        owners = [0 if i < self.cut * len(specs) else 1 for i in range(len(specs))]
        return Partition(tuple(specs), 2, tuple(Shard(i, r, 0, s.numel) for i, (s, r) in enumerate(zip(specs, owners))))


def test_oversubscription_is_refused_with_the_numbers_and_the_way_out():
    world = CORES * 2 + 1
    message = problems(f"dist.world_size={world}", f"data.global_batch={world}")
    assert f"dist.world_size={world}: {world} ranks on {CORES} CPU cores" in message
    assert f"dist.max_ranks_per_core=2 per core ({CORES * 2} ranks)" in message
    allowed = f"dist.max_ranks_per_core={math.ceil(world / CORES)}"
    assert allowed in message
    preflight([f"dist.world_size={world}", f"data.global_batch={world}", allowed, "optim=adam"])


def test_multirun_hint_is_kept_without_minus_m():
    message = problems("optim=adam,zero_adam")
    assert "optim=adam,zero_adam" in message and "add -m (--multirun)" in message


def test_manual_sweeps_over_world_sizes_and_a_wrong_list_names_the_job():
    preflight(["partitioner=manual", "dist.world_size=1,2,4"], multirun=True)
    preflight(["partitioner=manual", "partitioner.order=[layers.2.*,layers.*]", "dist.world_size=4"])
    message = problems("experiment=manual_mlp", "dist.world_size=2,4", multirun=True)
    assert "in the job `experiment=manual_mlp dist.world_size=4`" in message
    assert "params_per_rank has 2 entries but world_size is 4" in message
    assert "'partitioner.params_per_rank=[[pattern0.*],[pattern1.*],[pattern2.*],...]' (4 lists)" in message


def test_sweeps_expand_like_the_basic_sweeper():
    jobs = sweep_jobs(["optim=adam,zero_adam", "dist.world_size=range(1,3)", "+x=[1,2]"])
    assert jobs == [
        ["optim=adam", "dist.world_size=1", "+x=[1,2]"],
        ["optim=adam", "dist.world_size=2", "+x=[1,2]"],
        ["optim=zero_adam", "dist.world_size=1", "+x=[1,2]"],
        ["optim=zero_adam", "dist.world_size=2", "+x=[1,2]"],
    ]
    # a sweeper plugin's to expand: only the fixed overrides are checked up front
    assert sweep_jobs(["hydra/sweeper=optuna", "optim.lr=interval(0.001,0.1)", "steps=3"]) == [["steps=3"]]
    with pytest.raises(HydraException, match="BasicSweeper does not support sweep type"):  # and none to draw it
        sweep_jobs(["optim.lr=interval(0.001,0.1)", "steps=3"])


def test_a_plain_optimizer_notes_the_options_it_does_not_use():
    cfg, _, _ = compose_job(["optim=adam", "partitioner=flat", "bucket_view=true"])
    (note,) = notices(cfg, ["optim=adam", "partitioner=flat", "bucket_view=true", "steps=3"], RunPlan.of(cfg))
    assert note.startswith("partitioner=flat bucket_view=true: not used by torch.optim.Adam, a plain optimizer")
    zero, _, _ = compose_job(["partitioner=flat"])
    assert notices(zero, ["partitioner=flat"], RunPlan.of(zero)) == []


def test_each_job_is_checked_once():
    """What the check callback records in its process, the task does not check again (no env var)."""
    environ = dict(os.environ)
    preflight(["optim=adam,zero_adam", "steps=3", "seed=4321"], multirun=True)
    assert dict(os.environ) == environ
    for optim in ("adam", "zero_adam"):
        assert was_checked(compose_job([f"optim={optim}", "steps=3", "seed=4321"])[0])  # what main.run sees
    assert not was_checked(compose_job(["optim=adam", "steps=4", "seed=4321"])[0])


def test_the_app_uses_only_public_hydra_api():
    """No ``hydra._internal`` import anywhere in the app (the layering test covers cycles)."""
    for path in Path(zero_lab.app.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m.startswith("hydra._internal") for m in imported), path.name


# ---------------------------------------------------------------- issue 20: values and targets
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("seed=18446744073709551616", "seed=18446744073709551616: must fit in 64 bits (0 … 18446744073709551615)"),
        ("steps=9223372036854775808", "steps=9223372036854775808: must fit in 64 bits"),
        ("dist.stall_timeout_s=0", "dist.stall_timeout_s=0.0: must be > 0"),
    ],
)
def test_integers_must_fit_64_bits_and_the_stall_bound_be_positive(override, expected):
    assert expected in problems(override)


def test_the_largest_64_bit_seed_and_no_stall_watch_are_accepted():
    cfg, _ = preflight(["seed=18446744073709551615", "dist.stall_timeout_s=null"], multirun=False)
    assert cfg.seed == 2**64 - 1 and cfg.dist.stall_timeout_s is None  # kept as given, not clamped or defaulted
    ranks_get = to_container(cfg)  # what the job hands its ranks (RunSpec.config)
    assert ranks_get["seed"] == 2**64 - 1 and ranks_get["dist"]["stall_timeout_s"] is None


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["optim.optimizer_class._target_=builtins.open", "optim.optimizer_class.path={file}",
          "+optim.optimizer_class.mode=w"],
         "optim.optimizer_class._target_=builtins.open: must be hydra.utils.get_class"),
        (["partitioner._target_=builtins.open", "+partitioner.file={file}", "+partitioner.mode=w"],
         "partitioner._target_=builtins.open: must be a zero_lab.partition.Partitioner"),
    ],
)  # fmt: skip
def test_a_target_that_is_not_a_class_to_build_is_refused_without_being_called(tmp_path, overrides, key):
    created = tmp_path / "created-by-the-check"
    message = problems(*(o.format(file=created) for o in overrides))
    assert key in message
    assert not created.exists()


def test_a_model_priced_above_the_available_memory_is_refused_with_the_numbers():
    message = problems("model.hidden=60000")  # 3 × 60000² parameters: ≈ 40 GiB each of params, grads, ...
    assert re.search(
        r"model=mlp: the planner prices 2 rank\(s\) at [\d.]+ GiB before activations \(the fullest rank: "
        r"parameters [\d.]+, gradients [\d.]+, DDP buffers [\d.]+, optimizer state [\d.]+ GiB\), but this host has "
        r"[\d.]+ GiB available",
        message,
    ), message
