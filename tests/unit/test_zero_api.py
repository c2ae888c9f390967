"""The drop-in contract: torch's errors for bad input, local groups, add_param_group, bytes."""

from __future__ import annotations

import pytest
import torch

from zero_lab import Flat, ZeroRedundancyOptimizer


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ([], ValueError, "empty parameter list"),
        (torch.zeros(3, requires_grad=True), TypeError, "iterable of Tensors"),
        (42, TypeError, "iterable of Tensors or dicts"),
        ([torch.zeros(2), "not a tensor"], TypeError, "Tensors or dicts"),
        ([{"lr": 1.0}], ValueError, "'params' key"),
        ([{"params": [torch.zeros(2), 3]}], TypeError, "must hold Tensors"),
        ([torch.zeros(2), torch.zeros(2, dtype=torch.float64)], ValueError, "same dense type"),
        ([torch.zeros(2).to_sparse()], ValueError, "same dense type"),
    ],
)
def test_bad_params_raise_like_torch(single_rank_group, params, error, message):
    with pytest.raises(error, match=message):
        ZeroRedundancyOptimizer(params, torch.optim.Adam, lr=1e-3)


def test_torch_raises_the_same_error_types(single_rank_group):
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    for params, error in (
        ([], ValueError),
        (torch.zeros(3), TypeError),
        ([torch.zeros(2), torch.zeros(2).double()], ValueError),
    ):
        with pytest.raises(error):
            TorchZero(params, torch.optim.Adam, lr=1e-3)
        with pytest.raises(error):
            ZeroRedundancyOptimizer(params, torch.optim.Adam, lr=1e-3)


def test_flat_needs_an_elementwise_optimizer(single_rank_group):
    params = [torch.nn.Parameter(torch.randn(5))]
    with pytest.raises(ValueError, match=r"elementwise optimizer.*Use a whole-parameter partitioner"):
        ZeroRedundancyOptimizer(params, torch.optim.LBFGS, partitioner=Flat(), lr=1.0)


def test_optimizer_class_is_checked(single_rank_group):
    with pytest.raises(TypeError, match="optimizer_class"):
        ZeroRedundancyOptimizer([torch.nn.Parameter(torch.randn(2))], "Adam", lr=1e-3)


def test_state_dict_before_any_state_is_the_empty_plain_form(single_rank_group):
    """Issue 28: clients (accelerate's prepare) read state_dict() before any step; it is Adam's own."""
    param = torch.nn.Parameter(torch.randn(2))
    opt = ZeroRedundancyOptimizer([param], torch.optim.Adam, lr=1e-3)
    plain = torch.optim.Adam([param], lr=1e-3)
    assert opt.state_dict() == {"state": {}, "param_groups": plain.state_dict()["param_groups"]}
    assert len(opt.state) == 0
    opt.load_state_dict(opt.state_dict())
    assert len(opt.state) == 0


def test_load_state_dict_with_other_group_sizes_is_rejected(single_rank_group):
    opt = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.randn(2))], torch.optim.Adam, lr=1e-3)
    other = torch.optim.Adam([torch.nn.Parameter(torch.randn(2)), torch.nn.Parameter(torch.randn(2))])
    with pytest.raises(ValueError, match="param groups of sizes \\[2\\]"):
        opt.load_state_dict(other.state_dict())


def test_param_groups_sync_both_ways(single_rank_group):
    """An LR scheduler writes the wrapper's groups; keys the inner optimizer adds show up there."""
    opt = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.randn(4))], torch.optim.Adam, lr=1.0)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)  # added by the inner Adam
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    opt.param_groups[0]["params"][0].grad = torch.ones(4)
    opt.step()
    sched.step()
    opt.step()
    assert opt.optim.param_groups[0]["lr"] == 0.5
