"""Drop-in conformance: every public method of torch's documented ``ZeroRedundancyOptimizer``
API (``/work/shared/reference/torch-zero-api-doc.txt``: the constructor, ``step(closure)``,
``step(**kwargs)``, ``zero_grad``, ``consolidate_state_dict(to)``, ``state_dict``,
``load_state_dict``, ``add_param_group``, ``join_hook`` under ``Join``), in each argument form,
run on torch's class and on zero_lab's side by side over equal parameters (one Gloo rank,
in-process): the same return values, the same calls reaching the local optimizer, and the
parameters equal bit for bit after every call.

The world is one rank (the unit layer runs no processes); what W > 1 changes (the exchange,
consolidation across ranks, Join with uneven inputs) is walked in ``tests/dist``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

from zero_lab import ZeroRedundancyOptimizer


class KeywordSGD(torch.optim.SGD):
    """A local optimizer whose ``step`` takes an extra keyword and ignores its closure, as
    torch's class permits: it records every call it gets, so a test sees what reached it."""

    def __init__(self, params: Any, **defaults: Any):
        super().__init__(params, **defaults)
        self.calls: list[tuple[Any, Any]] = []

    def step(self, closure: Any = None, kwarg: Any = None) -> Any:  # type: ignore[override]
        self.calls.append((closure, kwarg))
        super().step()
        return kwarg


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return list(model.parameters())


def _grads(params: list[torch.nn.Parameter], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator)


Build = Callable[[type, list[torch.nn.Parameter]], torch.optim.Optimizer]


def _twins(build: Build) -> tuple[list[torch.nn.Parameter], Any, list[torch.nn.Parameter], Any]:
    """The same construction on torch's class and zero_lab's, over equal parameters."""
    theirs_params, ours_params = _params(), _params()
    return theirs_params, build(TorchZero, theirs_params), ours_params, build(ZeroRedundancyOptimizer, ours_params)


def _same(theirs: list[torch.Tensor], ours: list[torch.Tensor]) -> None:
    assert len(theirs) == len(ours)
    for a, b in zip(theirs, ours):
        assert torch.equal(a, b)


CONSTRUCTORS: dict[str, Build] = {
    "positional": lambda cls, p: cls(p, torch.optim.Adam, lr=1e-2),
    "keywords": lambda cls, p: cls(params=p, optimizer_class=torch.optim.Adam, lr=1e-2, betas=(0.8, 0.9)),
    "process_group": lambda cls, p: cls(p, torch.optim.Adam, process_group=None, lr=1e-2),
    "bucket_view": lambda cls, p: cls(p, torch.optim.Adam, parameters_as_bucket_view=True, lr=1e-2),
    "generator": lambda cls, p: cls((q for q in p), torch.optim.SGD, lr=0.1, momentum=0.9),
    "param_groups": lambda cls, p: cls([{"params": p[:2], "lr": 0.1}, {"params": p[2:]}], torch.optim.SGD, lr=0.01),
}


@pytest.mark.parametrize("form", sorted(CONSTRUCTORS))
def test_each_constructor_form_steps_like_torchs(single_rank_group, form):
    theirs_params, theirs, ours_params, ours = _twins(CONSTRUCTORS[form])
    assert [len(g["params"]) for g in ours.param_groups] == [len(g["params"]) for g in theirs.param_groups]
    assert ours.parameters_as_bucket_view == theirs.parameters_as_bucket_view
    for step in range(3):
        _grads(theirs_params, step)
        _grads(ours_params, step)
        assert theirs.step() is None and ours.step() is None
        _same(theirs_params, ours_params)
        theirs.zero_grad(set_to_none=step % 2 == 0)
        ours.zero_grad(set_to_none=step % 2 == 0)
        if step % 2 == 0:
            assert all(p.grad is None for p in theirs_params + ours_params)
        else:
            assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in theirs_params + ours_params)


def _sgd(cls: type, params: list[torch.nn.Parameter]) -> Any:
    return cls(params, torch.optim.SGD, lr=0.1, momentum=0.9)


def test_step_with_a_closure_returns_its_loss_and_steps_like_torchs(single_rank_group):
    theirs_params, theirs, ours_params, ours = _twins(_sgd)
    inputs = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))

    def closure_of(params: list[torch.nn.Parameter]) -> Callable[[], torch.Tensor]:
        def closure() -> torch.Tensor:
            for param in params:
                param.grad = None
            w1, b1, w2, b2 = params
            loss = (torch.tanh(inputs @ w1.T + b1) @ w2.T + b2).square().mean()
            loss.backward()
            return loss

        return closure

    for keyword in (False, True):
        if keyword:
            lost_theirs, lost_ours = theirs.step(closure=closure_of(theirs_params)), ours.step(closure_of(ours_params))
        else:
            lost_theirs, lost_ours = theirs.step(closure_of(theirs_params)), ours.step(closure=closure_of(ours_params))
        assert torch.equal(lost_theirs, lost_ours)
        _same(theirs_params, ours_params)


def _keyword_sgd(cls: type, params: list[torch.nn.Parameter]) -> Any:
    return cls(params, KeywordSGD, lr=0.1)


def test_step_kwargs_reach_the_local_optimizer_as_torchs_do(single_rank_group):
    theirs_params, theirs, ours_params, ours = _twins(_keyword_sgd)
    mine, yours = ["mine"], ["yours"]
    _grads(theirs_params, 0)
    _grads(ours_params, 0)
    assert theirs.step(kwarg=yours) is yours
    assert ours.step(kwarg=mine) is mine
    assert theirs.optim.calls == [(None, yours)]
    assert ours.optim.calls == [(None, mine)] and ours.optim.calls[0][1] is mine  # the object itself, not a copy
    _same(theirs_params, ours_params)


def test_a_non_callable_closure_is_passed_through_unchanged_as_torch_does(single_rank_group):
    """``opt.step(0, kwarg=my_list)``: torch's class hands the closure to the local optimizer
    as it came; zero_lab once wrapped it to re-point gradients and failed with
    ``TypeError: 'int' object is not callable``."""
    theirs_params, theirs, ours_params, ours = _twins(_keyword_sgd)
    my_list: list[int] = [1, 2]
    _grads(theirs_params, 0)
    _grads(ours_params, 0)
    assert theirs.step(0, kwarg=my_list) is my_list
    assert ours.step(0, kwarg=my_list) is my_list
    assert theirs.optim.calls == [(0, my_list)]
    assert ours.optim.calls == [(0, my_list)] and ours.optim.calls[0][1] is my_list
    _same(theirs_params, ours_params)
    marker = object()
    ours.step(closure=marker)
    assert ours.optim.calls[-1] == (marker, None)


def _adam(cls: type, params: list[torch.nn.Parameter]) -> Any:
    return cls(params, torch.optim.Adam, lr=1e-2)


def _stepped(steps: int = 2) -> tuple[list[torch.nn.Parameter], Any, list[torch.nn.Parameter], Any]:
    theirs_params, theirs, ours_params, ours = _twins(_adam)
    for step in range(steps):
        _grads(theirs_params, step)
        _grads(ours_params, step)
        theirs.step()
        ours.step()
    return theirs_params, theirs, ours_params, ours


@pytest.mark.parametrize("to", ["default", "keyword", "positional"])
def test_consolidate_then_state_dict_equals_torchs(single_rank_group, to):
    _, theirs, _, ours = _stepped()
    for opt in (theirs, ours):
        {"default": opt.consolidate_state_dict, "keyword": lambda o=opt: o.consolidate_state_dict(to=0),
         "positional": lambda o=opt: o.consolidate_state_dict(0)}[to]()  # fmt: skip
    theirs_state, ours_state = theirs.state_dict(), ours.state_dict()
    assert sorted(ours_state["state"]) == sorted(theirs_state["state"])
    for index, state in theirs_state["state"].items():
        assert sorted(ours_state["state"][index]) == sorted(state)
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(ours_state["state"][index][key]), torch.as_tensor(value)), key
    assert [g["params"] for g in ours_state["param_groups"]] == [g["params"] for g in theirs_state["param_groups"]]
    assert [g["lr"] for g in ours_state["param_groups"]] == [g["lr"] for g in theirs_state["param_groups"]]


@pytest.mark.parametrize("source", ["torch", "zero_lab", "plain_adam"])
def test_load_state_dict_from_either_class_or_a_plain_optimizer_continues_alike(single_rank_group, source):
    theirs_params, theirs, ours_params, ours = _stepped()
    if source == "plain_adam":
        plain_params = _params()
        plain = torch.optim.Adam(plain_params, lr=1e-2)
        for step in range(2):
            _grads(plain_params, step)
            plain.step()
        saved = plain.state_dict()
    else:
        donor = theirs if source == "torch" else ours
        donor.consolidate_state_dict()
        saved = donor.state_dict()
    fresh_theirs_params, fresh_ours_params = _params(), _params()
    with torch.no_grad():
        for fresh, trained in zip(fresh_theirs_params + fresh_ours_params, theirs_params + ours_params):
            fresh.copy_(trained)
    fresh_theirs, fresh_ours = _adam(TorchZero, fresh_theirs_params), _adam(ZeroRedundancyOptimizer, fresh_ours_params)
    fresh_theirs.load_state_dict(copy.deepcopy(saved))  # torch keeps a loaded ``step`` tensor as is: no sharing
    fresh_ours.load_state_dict(copy.deepcopy(saved))
    _grads(fresh_theirs_params, 7)
    _grads(fresh_ours_params, 7)
    fresh_theirs.step()
    fresh_ours.step()
    _same(fresh_theirs_params, fresh_ours_params)


def test_add_param_group_then_steps_like_torchs(single_rank_group):
    theirs_params, theirs, ours_params, ours = _twins(lambda cls, p: cls(p[:2], torch.optim.Adam, lr=1e-2))
    theirs.add_param_group({"params": theirs_params[2:], "lr": 0.5})
    ours.add_param_group({"params": ours_params[2:], "lr": 0.5})
    assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in theirs.param_groups] == [1e-2, 0.5]
    for step in range(2):
        _grads(theirs_params, step)
        _grads(ours_params, step)
        theirs.step()
        ours.step()
    _same(theirs_params, ours_params)


def test_param_group_edits_reach_the_local_optimizer_like_torchs(single_rank_group):
    theirs_params, theirs, ours_params, ours = _twins(_adam)
    for opt in (theirs, ours):
        opt.param_groups[0]["lr"] = 0.5
    _grads(theirs_params, 0)
    _grads(ours_params, 0)
    theirs.step()
    ours.step()
    assert ours.optim.param_groups[0]["lr"] == theirs.optim.param_groups[0]["lr"] == 0.5
    _same(theirs_params, ours_params)


def test_join_with_its_hook_steps_like_torchs(single_rank_group):
    theirs_params, theirs, ours_params, ours = _twins(_adam)
    for params, opt in ((theirs_params, theirs), (ours_params, ours)):
        assert opt.join_device == torch.device("cpu")
        assert opt.join_process_group is not None
        with Join([opt]):
            for step in range(2):
                _grads(params, step)
                opt.step()
    _same(theirs_params, ours_params)
