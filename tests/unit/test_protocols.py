"""The model/data protocol (zero_lab/app/workloads/protocols.py), no processes: what forward may return,
where the loss comes from, the two ways data is read, and the pre-start check's messages."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from zero_lab.app.workloads.data import RegressionData
from zero_lab.app.workloads.protocols import (
    GlobalBatchData,
    MetaProbe,
    RankStreamData,
    batch_stream,
    call_model,
    forward_problems,
    loss_of,
    probe_on_meta,
    protocol_problems,
    task_of,
)


class DictNet(nn.Module):
    task = "regression"

    def __init__(self, unused: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 3)
        self.spare = nn.Linear(3, 3) if unused else None

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"pred": self.body(x), "hidden": x.sum(-1)}


class OwnLoss(nn.Module):
    """Takes a dict of inputs and returns its own loss (as a transformers model given labels does)."""

    task = "regression"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.body(x)
        return {"logits": out, "loss": F.mse_loss(out, labels)}


class Stream:
    task = "regression"
    global_batch = 4

    def batches(self, rank, world_size, start_step):
        for step in itertools.count(start_step):
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(self.global_batch // world_size, 4, generator=g)
            yield x, x[:, :3]


class NoLoss(Stream):
    def batches(self, rank, world_size, start_step):
        for x, y in super().batches(rank, world_size, start_step):
            yield {"x": x, "labels": y}, None


def test_a_dict_output_is_read_at_output_key_and_gives_the_tensor_loss():
    data = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    x, y = data.shard(0, 0, 1)
    model = DictNet()
    from_dict = loss_of(call_model(model, x), y, data, output_key="pred")
    assert torch.equal(from_dict, data.loss(model.body(x), y))
    with pytest.raises(TypeError, match=r"output_key=logits: .* without a tensor 'logits' \(it has: pred, hidden\)"):
        loss_of(call_model(model, x), y, data)


def test_data_without_a_loss_takes_the_models_own():
    data = NoLoss()
    inputs, targets = next(batch_stream(data, 0, 1, 0))
    model = OwnLoss()
    loss = loss_of(call_model(model, inputs), targets, data)
    assert torch.equal(loss, F.mse_loss(model.body(inputs["x"]), inputs["labels"]))
    with pytest.raises(TypeError, match="has no loss\\(output, targets\\) and the model's forward returned no 'loss'"):
        loss_of(torch.zeros(2, 3), None, data)


def test_both_data_protocols_give_each_rank_its_batches_from_a_start_step():
    regression = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    assert isinstance(regression, GlobalBatchData) and isinstance(Stream(), RankStreamData)
    first = next(batch_stream(regression, 1, 2, 5))
    assert torch.equal(first[0], regression.shard(5, 1, 2)[0])
    stream = batch_stream(Stream(), 1, 2, 3)
    x, _ = next(stream)
    assert torch.equal(x, torch.randn(2, 4, generator=torch.Generator().manual_seed(301)))


def test_missing_task_and_reader_are_named_with_the_fix():
    class Bare(nn.Module):
        pass

    class Nothing:
        task = "regression"

    problems = protocol_problems(Bare, Nothing, "model=bare", "data=nothing")
    assert problems[0].startswith("model=bare: ")
    assert "has no `task` attribute; add the class attribute `task = 'regression'`" in problems[0]
    assert problems[1].startswith("data=nothing: ")
    assert "offers neither shard(step, rank, world_size) nor batches(" in problems[1]
    (mismatch,) = protocol_problems(DictNet, type("Lm", (Stream,), {"task": "lm"}), "model=d", "data=lm")
    assert "model=d is a 'regression' model and needs data for that task, but this data's task is 'lm'" in mismatch


def test_the_meta_forward_names_the_output_key_and_unused_parameters():
    data = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    with torch.device("meta"):
        model, spare = DictNet(), DictNet(unused=True)
    assert forward_problems(probe_on_meta(model, data, 2, "pred")) == []
    (wrong_key,) = forward_problems(probe_on_meta(model, data, 2, "logits"))
    assert "output_key=logits" in wrong_key and "set output_key=<one of those>" in wrong_key
    (unused,) = forward_problems(probe_on_meta(spare, data, 2, "pred"))
    assert "leaves 2 parameter(s) unused (spare.weight, spare.bias)" in unused
    assert "set dist.find_unused_parameters=true" in unused
    assert forward_problems(probe_on_meta(spare, data, 2, "pred"), find_unused_parameters=True) == []
    with torch.device("meta"):
        own = OwnLoss()
    assert forward_problems(probe_on_meta(own, NoLoss(), 2, "logits")) == []


def test_a_transformers_class_takes_its_task_from_transformers_tables():
    """Causal LMs are "lm", image classifiers "image"; a class in neither is refused with the subclass fix."""
    import transformers

    assert task_of(transformers.GPT2LMHeadModel) == "lm" and task_of(transformers.LlamaForCausalLM) == "lm"
    assert task_of(transformers.ViTForImageClassification) == "image"
    assert task_of(transformers.GPT2Model) is None and task_of(DictNet) == "regression"
    assert protocol_problems(transformers.GPT2LMHeadModel, type("Lm", (Stream,), {"task": "lm"}), "m", "d") == []
    (problem,) = protocol_problems(transformers.GPT2Model, type("Lm", (Stream,), {"task": "lm"}), "model=g", "data=d")
    assert problem.startswith(
        "model=g: GPT2Model has no `task` attribute; it is in none of transformers' tables of causal LMs or image "
        "classifiers; subclass it with `task = 'lm'` and name the subclass in _target_"
    )


class _RefusingGrad(torch.autograd.Function):
    """Identity forward; a backward that raises what user code may raise (not a meta-kernel limit)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        raise TypeError("no meta tensors of that kind")


class OwnBackward(nn.Module):
    task = "regression"

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RefusingGrad.apply(self.lin(x))


def test_a_backward_that_fails_for_its_own_reason_is_named():
    data = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    with torch.device("meta"):
        model = OwnBackward()
    (problem,) = forward_problems(probe_on_meta(model, data, 2, "logits"))
    assert problem == ("model: its backward fails on the data's first batch: TypeError: no meta tensors of that kind")


class Branchy(nn.Module):
    """A forward whose behaviour the probe cannot or can judge, by what it does (never by its error's text)."""

    task = "regression"

    def __init__(self, mode: str):
        super().__init__()
        self.lin, self.mode = nn.Linear(4, 3), mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        if self.mode == "branch" and out.sum() > 0:  # reads a value: meta tensors have none
            out = out * 2
        if self.mode == "item":
            out = out * out.abs().max().item()
        if self.mode == "positions":  # a tensor made inside forward, without a device
            out = out + torch.arange(3)
        if self.mode == "raises":
            raise ValueError("metadata of the batch is missing")  # the user's own error, "meta" in its text
        if self.mode == "shape":
            out = out @ torch.ones(4, 2)  # (N, 3) @ (4, 2): a batch the model cannot take
        return out


@pytest.mark.parametrize("mode", ["branch", "item", "positions"])
def test_a_forward_the_meta_device_cannot_run_is_not_judged(mode: str):
    data = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    with torch.device("meta"):
        model = Branchy(mode)
    assert forward_problems(probe_on_meta(model, data, 2, "logits")) == []
    assert all(p.grad is None for p in model.parameters())  # the plan's model is left as it was


def test_a_forward_that_fails_for_its_own_reason_is_named_whatever_its_message_says():
    data = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    with torch.device("meta"):
        raises, shape = Branchy("raises"), Branchy("shape")
    assert forward_problems(probe_on_meta(raises, data, 2, "logits")) == [
        "model: its forward fails on the data's first batch: ValueError: metadata of the batch is missing"
    ]
    (problem,) = forward_problems(probe_on_meta(shape, data, 2, "logits"))
    assert problem.startswith("model: its forward fails on the data's first batch: RuntimeError: ")


def test_the_probe_lists_the_parameters_no_gradient_reaches():
    data = RegressionData(global_batch=8, in_dim=4, out_dim=3, seed=0)
    with torch.device("meta"):
        spare, branchy = DictNet(unused=True), Branchy("branch")
    assert probe_on_meta(spare, data, 2, "pred") == MetaProbe([], ["spare.weight", "spare.bias"])
    assert probe_on_meta(branchy, data, 2, "logits") == MetaProbe([], None)  # not judged: nothing listed
