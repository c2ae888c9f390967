"""A checkpoint's optimizer state is checked like its ranges (issue 30): per parameter, the
state keys and each tensor's shape and dtype against what the class stepping it makes
(learnt from a step of that class on meta tensors, :mod:`zero_lab.state_probe`), the file,
the parameter and the key named. The cases are the attacker's: a Muon ``momentum_buffer`` of
95 × 32 for a 96 × 32 matrix (it failed inside Muon's step, naming nothing), and a shard whose
``momentum_buffer`` was deleted (it resumed silently with fresh momentum); the app's plain
``step_N.pt`` files get the same check, and resuming ``optim=zero_muon`` into ``optim=zero_adam``
names Muon, not ``ChainedOptimizer``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ZeroRedundancyOptimizer, muon_param_groups
from zero_lab.app.run import checkpoints as run_checkpoints
from zero_lab.app.run.checkpoints import ResumeMismatch
from zero_lab.app.run.training import Training
from zero_lab.checkpoint import CheckpointError, load_checked_file, load_checkpoint, save_checkpoint, save_file
from zero_lab.state_probe import Expected, expected_state, state_problem

FILE = "optim-rank00000.pt"


class Net(nn.Module):
    """A hidden 96 × 32 matrix for Muon between an input and a head for AdamW."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(4, 32)
        self.hidden = nn.Linear(32, 96, bias=False)
        self.head = nn.Linear(96, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))


def _muon(model: nn.Module) -> ZeroRedundancyOptimizer:
    groups = muon_param_groups(model, muon={"lr": 0.02})
    return ZeroRedundancyOptimizer(groups, torch.optim.AdamW, lr=1e-3)


@pytest.fixture
def saved(tmp_path, single_rank_group) -> Path:
    model = Net()
    opt = _muon(model)
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(3, 4)).square().mean().backward()
        opt.step()
    return save_checkpoint(tmp_path / "step_00000002", opt, model)


def _tamper(directory: Path, edit: Callable[[dict[int, Any]], None]) -> None:
    """Edit the shard file's states and record its new size and sha256 in the manifest, as an
    attacker who rewrites both would (the checksums only catch accidents)."""
    path = directory / FILE
    shards = torch.load(path, weights_only=True)
    edit({index: state for index, (_, _, state) in shards["shards"].items()})
    torch.save(shards, path)
    manifest = json.loads((directory / "manifest.json").read_text())
    data = path.read_bytes()
    manifest["files"][FILE].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _index(directory: Path, name: str = "hidden.weight") -> int:
    names = [p["name"] for p in json.loads((directory / "manifest.json").read_text())["params"]]
    return names.index(name)


def _load(directory: Path) -> None:
    model = Net()
    load_checkpoint(directory, _muon(model), model)


def test_an_untampered_muon_checkpoint_loads_and_continues_like_the_original(saved):
    model = Net()
    opt = _muon(model)
    load_checkpoint(saved, opt, model)
    state = opt.optim.optimizers[0].state  # Muon's
    assert sorted(tuple(s["momentum_buffer"].shape) for s in state.values()) == [(32, 4), (96, 32)]


def test_a_momentum_buffer_of_the_wrong_shape_names_file_parameter_and_key(saved):
    index = _index(saved)

    def shrink(states: dict[int, Any]) -> None:
        states[index]["momentum_buffer"] = states[index]["momentum_buffer"][:95].clone()

    _tamper(saved, shrink)
    with pytest.raises(CheckpointError) as error:
        _load(saved)
    assert str(error.value).startswith(
        f"checkpoint {saved}: {FILE}: the saved state of parameter 'hidden.weight' (#{index}) holds "
        "'momentum_buffer' of shape (95, 32), where Muon keeps (96, 32); "
    )


def test_a_deleted_momentum_buffer_is_refused_not_resumed_with_fresh_momentum(saved):
    index = _index(saved)
    _tamper(saved, lambda states: states[index].pop("momentum_buffer"))
    with pytest.raises(CheckpointError, match=rf"{FILE}: the saved state of parameter 'hidden.weight' \(#{index}\) "
                       r"lacks the state 'momentum_buffer' that Muon keeps \(it holds nothing\)"):  # fmt: skip
        _load(saved)


def test_an_adamw_state_without_exp_avg_sq_is_named(saved):
    index = _index(saved, "head.bias")

    def drop(states: dict[int, Any]) -> None:
        del states[index]["exp_avg_sq"]

    _tamper(saved, drop)
    with pytest.raises(CheckpointError, match=rf"parameter 'head.bias' \(#{index}\) lacks the state 'exp_avg_sq' that "
                       r"AdamW keeps \(it holds \['exp_avg', 'step'\]\)"):  # fmt: skip
        _load(saved)


def test_a_state_tensor_of_another_kind_of_dtype_is_named(saved):
    index = _index(saved, "head.bias")

    def as_int(states: dict[int, Any]) -> None:
        states[index]["exp_avg"] = states[index]["exp_avg"].to(torch.int32)

    _tamper(saved, as_int)
    with pytest.raises(CheckpointError, match=r"holds 'exp_avg' of dtype torch.int32, where AdamW keeps torch.float32"):
        _load(saved)


def test_what_each_class_keeps_is_learnt_from_the_class():
    """Meta tensors for most classes, two tiny real ones for a class that reads ``.item()``
    (Adafactor), nothing for one that needs a closure (LBFGS)."""
    adam = expected_state(torch.optim.Adam, {"lr": 1e-3, "amsgrad": True, "fused": True}, (96, 32), torch.float32)
    assert adam is not None and sorted(adam) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]
    assert adam["exp_avg"] == Expected(True, (96, 32), torch.float32) and adam["step"].shape == ()
    assert expected_state(torch.optim.SGD, {"lr": 0.1, "momentum": 0.0}, (4,), torch.float32) == {}
    factored = expected_state(torch.optim.Adafactor, {"lr": 1e-2}, (6, 4), torch.float32)
    assert factored is not None
    assert (factored["row_var"].shape, factored["col_var"].shape) == ((6, 1), (1, 4))
    assert expected_state(torch.optim.LBFGS, {"lr": 1.0}, (3,), torch.float32) is None
    wrong = {"row_var": torch.zeros(6, 1), "col_var": torch.zeros(1, 5), "step": torch.tensor(1.0)}
    assert (
        state_problem(wrong, factored, "Adafactor") == "holds 'col_var' of shape (1, 5), where Adafactor keeps (1, 4)"
    )


def _training(model: nn.Module, optimizer: torch.optim.Optimizer, zero: bool) -> Training:
    return Training(model=model, ddp=DDP(model), optimizer=optimizer, zero=zero)


def test_resuming_zero_muon_into_zero_adam_names_muon_not_the_chain(tmp_path, single_rank_group):
    model = Net()
    opt = _muon(model)
    model(torch.ones(3, 4)).square().mean().backward()
    opt.step()
    saved = save_checkpoint(tmp_path / "step_00000001", opt, model, extra={"step": 1, "losses": [1.0]})
    other = Net()
    adam = _training(other, ZeroRedundancyOptimizer(other.parameters(), torch.optim.Adam, lr=1e-3), zero=True)
    with pytest.raises(ResumeMismatch) as error:
        run_checkpoints.restore(adam, saved, steps=5)
    assert str(error.value).startswith(
        f"{saved} holds the state of torch.optim.Muon + the default class (a zero_lab.chained.ChainedOptimizer); "
        "this run builds torch.optim.Adam. Pick the optim it was saved with"
    )


def test_a_plain_checkpoint_missing_a_state_key_names_the_file_and_parameter(tmp_path, single_rank_group):
    model = Net()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(3, 4)).square().mean().backward()
    adam.step()
    path = run_checkpoints.save(_training(model, adam, zero=False), tmp_path, 1, [1.0])
    state = load_checked_file(path)
    del state["optimizer"]["state"][2]["exp_avg"]  # hidden.weight
    save_file(state, path)  # its size and sha256 recorded anew: only the state check can tell
    fresh = Net()
    resumed = _training(fresh, torch.optim.Adam(fresh.parameters(), lr=1e-3), zero=False)
    with pytest.raises(CheckpointError, match=rf"^{path}: the saved state of parameter 'hidden.weight' \(#2\) lacks "
                       r"the state 'exp_avg' that Adam keeps \(it holds \['exp_avg_sq', 'step'\]\)"):  # fmt: skip
        run_checkpoints.restore(resumed, path, steps=5)


def test_a_sharded_checkpoint_resumes_a_plain_optimizer_with_its_state_checked(tmp_path, single_rank_group):
    """ZeRO's shards merged for a plain optimizer pass the same check (no false refusal), and a
    tampered shard is named there too."""
    model = Net()
    zero = ZeroRedundancyOptimizer(model.named_parameters(), torch.optim.Adam, lr=1e-3)
    model(torch.ones(3, 4)).square().mean().backward()
    zero.step()
    path = run_checkpoints.save(_training(model, zero, zero=True), tmp_path, 1, [1.0])
    fresh = Net()
    plain = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    restored = run_checkpoints.restore(_training(fresh, plain, zero=False), path, steps=5)
    assert restored.step == 1 and all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    assert [tuple(s["exp_avg"].shape) for s in plain.state.values()] == [tuple(p.shape) for p in fresh.parameters()]
    index = _index(path, "head.weight")

    def transpose(states: dict[int, Any]) -> None:
        states[index]["exp_avg_sq"] = states[index]["exp_avg_sq"].t().contiguous()

    _tamper(path, transpose)
    other = Net()
    with pytest.raises(CheckpointError, match=rf"the saved state of parameter 'head.weight' \(#{index}\) holds "
                       r"'exp_avg_sq' of shape \(96, 2\), where Adam keeps \(2, 96\)"):  # fmt: skip
        run_checkpoints.restore(_training(other, torch.optim.Adam(other.parameters(), lr=1e-3), zero=False), path, 5)


def test_files_that_spell_the_class_by_its_module_keep_resuming(tmp_path, single_rank_group):
    """A class is written one way, ``torch.optim.AdamW`` (:func:`zero_lab.chained.class_path`); files
    that spelled it by its module (``torch.optim.adamw.AdamW``: manifests, app checkpoints and group
    classes written before) resume without a false class or hyper-parameter mismatch."""

    def routed(model: nn.Module) -> ZeroRedundancyOptimizer:
        groups = [{"params": [model.hidden.weight], "optimizer_class": torch.optim.AdamW, "lr": 1e-3}]
        others = [p for n, p in model.named_parameters() if n != "hidden.weight"]
        return ZeroRedundancyOptimizer([*groups, {"params": others}], torch.optim.Adam, lr=1e-3)

    model = Net()
    opt = routed(model)
    model(torch.ones(3, 4)).square().mean().backward()
    opt.step()
    sharded = run_checkpoints.save(_training(model, opt, zero=True), tmp_path / "zero", 1, [1.0])
    manifest = json.loads((sharded / "manifest.json").read_text())
    assert manifest["optimizer_class"] == "zero_lab.chained.ChainedOptimizer"
    assert [g.get("optimizer_class") for g in manifest["param_groups"]] == ["torch.optim.AdamW", None]
    manifest["param_groups"][0]["optimizer_class"] = "torch.optim.adamw.AdamW"
    (sharded / "manifest.json").write_text(json.dumps(manifest))
    fresh = Net()
    assert run_checkpoints.restore(_training(fresh, routed(fresh), zero=True), sharded, steps=5).step == 1

    plain = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = run_checkpoints.save(_training(model, plain, zero=False), tmp_path / "plain", 1, [1.0])
    state = load_checked_file(path)
    assert state["optimizer_class"] == "torch.optim.Adam"
    save_file({**state, "optimizer_class": "torch.optim.adam.Adam"}, path)
    other = Net()
    resumed = _training(other, torch.optim.Adam(other.parameters(), lr=1e-3), zero=False)
    assert run_checkpoints.restore(resumed, path, 5).step == 1
    sgd = Net()
    with pytest.raises(
        ResumeMismatch, match=r"holds the state of torch\.optim\.Adam; this run builds torch\.optim\.SGD\."
    ):
        run_checkpoints.restore(_training(sgd, torch.optim.SGD(sgd.parameters(), lr=1e-3), zero=False), path, 5)
