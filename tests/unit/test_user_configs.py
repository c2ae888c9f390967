"""A researcher's own configs, checked as ours are (no processes): unknown top-level keys are
refused with or without ``+``; YAMLs in their own ``--config-dir`` / ``hydra.searchpath`` get
keys derived from *their* ``_target_``, the pre-start check and "did you mean"."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from hydra.main import get_args_parser
from hydra.utils import instantiate

from tests.preflight import compose_job, preflight, problems
from zero_lab.app.config.schema import register_configs
from zero_lab.app.launch.entry import user_config_dirs
from zero_lab.app.workloads.protocols import call_model, loss_of

USER_MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    task = "regression"

    def __init__(self, in_dim: int, out_dim: int, width: int = 16, scale: float = 1.0):
        super().__init__()
        self.body = nn.Linear(in_dim, width)
        self.head = nn.Linear(width, out_dim)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x))) * self.scale
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A module outside the repo (``usermodels_cfgtest.Net``) and its YAML in the user's config dir."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "usermodels_cfgtest.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    conf = tmp_path / "myconf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "net.yaml").write_text(
        textwrap.dedent("""\
            _target_: usermodels_cfgtest.Net
            in_dim: 256
            out_dim: 256
        """)
    )
    register_configs(extra_dirs=[conf])
    yield conf
    sys.modules.pop("usermodels_cfgtest", None)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+warmup_steps=10", "warmup_steps: no such key; the top level takes: optim, partitioner"),
        ("+stepz=3", "stepz: no such key; did you mean steps?"),
        ("+accumulate_grad_batches=4", "accumulate_grad_batches: no such key; did you mean accumulate?"),
        ("+dist.world_sise=2", "dist.world_sise: no such key; did you mean dist.world_size? dist takes: world_size"),
    ],
)
def test_unknown_top_level_keys_are_refused_with_or_without_plus(override, expected):
    assert expected in problems(override)


def test_a_user_yaml_gets_keys_from_its_own_target(user_dir):
    cfg, choices, _ = compose_job(["model=net", "model.width=32"], user_dir=user_dir)
    assert choices["model"] == "net"
    assert (cfg.model.width, cfg.model.scale) == (32, 1.0)  # width, scale: Net's defaults, not in net.yaml
    preflight(["model=net", "model.width=32"], user_dir=user_dir)  # the whole pre-start check passes
    message = problems("model=net", "model.widht=32", user_dir=user_dir)
    assert "model.widht: no such key; did you mean model.width? model takes: in_dim, out_dim, width, scale" in message
    assert "model.width=wide: Value 'wide' of type 'str' could not be converted to Integer" in problems(
        "model=net", "model.width=wide", user_dir=user_dir
    )


def test_hydra_searchpath_is_the_same_as_config_dir(user_dir):
    overrides = [f"hydra.searchpath=[file://{user_dir}]", "model=net", "model.width=8"]
    assert user_config_dirs(overrides) == [user_dir.resolve()]
    cfg, _, _ = compose_job(overrides)
    assert cfg.model.width == 8
    assert "model.widht: no such key; did you mean model.width?" in problems(*overrides[:2], "model.widht=3")


def test_config_dir_is_read_with_hydras_own_parser(tmp_path):
    """What ``train.py`` reads before Hydra starts: the user's config dirs, with the parser @hydra.main uses."""
    args = get_args_parser().parse_args(["-m", "--config-dir", str(tmp_path), "model=net"])
    assert (args.multirun, args.config_dir, args.overrides) == (True, str(tmp_path), ["model=net"])
    assert user_config_dirs(args.overrides, args.config_dir) == [tmp_path.resolve()]


def test_removing_a_schema_key_says_what_to_do():
    message = problems("~model.hidden")
    assert "~model.hidden: the keys of model are its _target_'s arguments and cannot be removed" in message
    assert "--config-dir DIR with DIR/model/<name>.yaml" in message


def test_a_foreign_target_on_the_command_line_points_to_a_yaml_of_its_own():
    message = problems("model._target_=torch.nn.Linear", "+model.in_features=4", "+model.out_features=4")
    assert "model.in_dim, model.hidden" in message
    assert "not arguments of torch.nn.Linear" in message
    assert "give it its own YAML (--config-dir DIR with DIR/model/<name>.yaml" in message


HF_MODEL = """\
_target_: transformers.GPT2LMHeadModel
config:
  _target_: transformers.GPT2Config
  vocab_size: 256
  n_positions: 16
  n_embd: 32
  n_layer: 1
  n_head: 2
  bos_token_id: null
  eos_token_id: null
"""


def test_a_transformers_class_named_in_yaml_with_its_config_trains_a_step(tmp_path):
    """``model._target_: transformers.GPT2LMHeadModel`` with a ``config`` node: checked before start
    like ours (task "lm" from transformers' tables, a config key overridden from the command
    line), then built as the ranks build it and stepped once on data=text: logits read from ``.logits``."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "gpt2_hf.yaml").write_text(HF_MODEL)
    (tmp_path / "text.txt").write_text("def add(a, b):\n    return a + b\n" * 40)
    register_configs(extra_dirs=[tmp_path / "conf"])
    overrides = ["model=gpt2_hf", "model.config.n_layer=2", "data=text", f"data.path={tmp_path / 'text.txt'}"]
    cfg, _ = preflight([*overrides, "data.seq_len=16"], user_dir=tmp_path / "conf")  # the whole pre-start check
    torch.manual_seed(0)
    model, data = instantiate(cfg.model), instantiate(cfg.data)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.n_layer == 2
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs, targets = data.shard(0, 0, 1)
    losses = []
    for _ in range(2):
        loss = loss_of(call_model(model, inputs), targets, data, str(cfg.output_key))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert cfg.output_key == "logits" and losses[1] < losses[0]
    message = problems("model=gpt2_hf", "data=regression", user_dir=tmp_path / "conf")
    assert "model=gpt2_hf is a 'lm' model and needs data for that task, but this data's task is 'regression'" in message
