"""Issue 30, item 1: every ``_target_`` the app builds is checked (import + lookup only) before
anything is called, by the same check ``python train.py`` runs (no processes). Each attack of the
issue aims at a victim file: the file is untouched and the refusal names the key."""

from __future__ import annotations

import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from tests.preflight import preflight, problems
from zero_lab.app.config.schema import GROUPS, register_configs
from zero_lab.app.config.targets import RULES, check_targets, refusal, target_problem

VICTIM_TEXT = "precious\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    yield path
    assert path.read_text() == VICTIM_TEXT  # every test here: the check never opened it


def _user_dir(tmp_path, group: str, name: str, text: str):
    conf = tmp_path / "myconf"
    (conf / group).mkdir(parents=True)
    (conf / group / f"{name}.yaml").write_text(textwrap.dedent(text))
    register_configs(extra_dirs=[conf])
    return conf


def test_builtins_open_as_data_is_refused_before_the_data_is_built(tmp_path, victim):
    conf = _user_dir(tmp_path, "data", "evil", f"""\
        _target_: builtins.open
        file: {victim}
        mode: w
        global_batch: 32
        """)  # fmt: skip
    message = problems("data=evil", user_dir=conf)
    assert message.count("\n  - ") == 1, message  # one problem: nothing else ran to report more
    assert "data._target_=builtins.open: must be a class with shard(step, rank, world_size) or batches(" in message
    assert "it names a function of the standard library, and was not called" in message


def test_logging_basic_config_as_logger_is_refused(tmp_path, victim):
    conf = _user_dir(tmp_path, "logger", "evil", f"""\
        _target_: logging.basicConfig
        _partial_: true
        force: true
        filemode: w
        filename: {victim}
        """)  # fmt: skip
    message = problems("logger=evil", user_dir=conf)
    assert "logger._target_=logging.basicConfig: must be a class with log, summary and close" in message
    assert "(zero_lab.app.record.sinks.MetricSink)" in message


def test_a_scheduler_target_that_is_no_scheduler_is_refused(tmp_path, victim):
    conf = _user_dir(tmp_path, "scheduler", "evil", f"""\
        _target_: builtins.open
        file: {victim}
        mode: w
        """)  # fmt: skip
    message = problems("scheduler=evil", user_dir=conf)
    expected = "scheduler._target_=builtins.open: must be a torch.optim.lr_scheduler class, or a class of yours with"
    assert expected in message


def test_param_groups_given_on_the_command_line_are_checked_before_they_are_called(victim):
    message = problems(f"+optim.param_groups={{_target_:builtins.open,file:{victim},mode:w}}")
    assert "optim.param_groups._target_=builtins.open: must be a Python function model -> param groups" in message
    message = problems("+optim.param_groups={_target_:zero_lab.muon_param_groups}")  # called at once, without the model
    assert "optim.param_groups: add optim.param_groups._partial_=true" in message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model._target_=os.system", "model._target_=os.system: must be a torch.nn.Module subclass"),
        ("model._target_=torch.save", "it names a function of torch's I/O and process machinery"),
        ("model._target_=hydra.utils.call", "model._target_=hydra.utils.call: must be a torch.nn.Module subclass"),
        ("optim._target_=subprocess.run", "optim._target_=subprocess.run: must be a torch.optim.Optimizer subclass"),
        ("partitioner._target_=shutil.rmtree", "_target_=shutil.rmtree: must be a zero_lab.partition.Partitioner"),
        ("optim.optimizer_class.path=builtins.exec", "class.path=builtins.exec: must be hydra.utils.get_class"),
    ],
)  # fmt: skip
def test_standard_library_and_torch_machinery_are_never_targets(override, expected):
    assert expected in problems(override)


def test_a_target_nested_in_a_group_is_checked_too(victim):
    node = OmegaConf.create(
        {"_target_": "zero_lab.app.workloads.models.MLP", "extra": {"_target_": "builtins.open", "file": str(victim)}}
    )
    assert target_problem("model.extra", node.extra) == (
        "model.extra._target_=builtins.open: must be a lookup, a class or a function of yours; it names a function "
        "of the standard library, and was not called"
    )
    cfg = OmegaConf.create({"model": node, "data": {"_target_": "zero_lab.app.workloads.data.RegressionData"}})
    assert check_targets(cfg) == [target_problem("model.extra", node.extra)]
    lookup = OmegaConf.create({"_target_": "hydra.utils.get_method", "path": "os.system"})
    expected = "model.cost.path=os.system: must be a lookup, a class or a function of yours"
    assert expected in target_problem("model.cost", lookup)


def test_a_constructor_refusal_names_the_key_without_hydras_wrapper():
    message = problems("partitioner.cost=bogus")
    assert (
        "partitioner=sorted_greedy: cannot be built: partitioner.cost=bogus: SortedGreedy refuses it: "
        "cost='bogus' is not one of ['newton_schulz', 'numel']" in message
    )
    assert "Error in call to target" not in message and "full_key" not in message
    node = {"_target_": "x.Scheduler", "step_size": 0, "gamma": 0.5}
    assert refusal("scheduler", node, ValueError("boom"), blamed=["step_size"]) == (
        "scheduler.step_size=0: Scheduler refuses it: boom"
    )
    assert refusal("scheduler", node, ValueError("boom")) == "Scheduler refuses the configured arguments: boom"


def test_a_users_own_classes_pass(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "usersched_cfgtest.py").write_text(
        textwrap.dedent("""\
            class Halving:
                def __init__(self, optimizer, every: int = 5):
                    self.optimizer, self.every, self.count = optimizer, every, 0

                def step(self):
                    self.count += 1

                def state_dict(self):
                    return {"count": self.count}

                def load_state_dict(self, state):
                    self.count = state["count"]
            """)
    )
    monkeypatch.syspath_prepend(str(code))
    conf = _user_dir(tmp_path, "scheduler", "halving", """\
        _target_: usersched_cfgtest.Halving
        _partial_: true
        every: 3
        """)  # fmt: skip
    try:
        preflight(["scheduler=halving"], user_dir=conf)
    finally:
        sys.modules.pop("usersched_cfgtest", None)


def test_every_group_the_app_builds_has_a_rule():
    assert set(GROUPS) <= set(RULES)
