"""The core's API checked at the call (one rank): ``consolidate_state_dict(to)`` outside the
group, and ``load_state_dict`` of another model's state, each a ``ValueError`` naming it."""

from __future__ import annotations

import pytest
import torch

from zero_lab import ZeroRedundancyOptimizer


def _stepped(model: torch.nn.Module, cls: type = torch.optim.Adam) -> torch.optim.Optimizer:
    opt = cls(model.parameters(), lr=1e-3)
    model(torch.ones(1, model[0].in_features)).sum().backward()
    opt.step()
    return opt


@pytest.mark.parametrize("to", [1, 5, -1, "0", True])
def test_consolidate_to_a_rank_outside_the_group_is_refused(single_rank_group, to):
    opt = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.randn(2))], torch.optim.Adam, lr=1e-3)
    with pytest.raises(ValueError, match=r"consolidate_state_dict\(to=.*0 <= to < 1"):
        opt.consolidate_state_dict(to=to)


def test_load_state_dict_of_another_model_names_the_parameter(single_rank_group):
    ours = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 4))
    theirs = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4))
    opt = ZeroRedundancyOptimizer(ours.parameters(), torch.optim.Adam, lr=1e-3)
    saved = _stepped(theirs).state_dict()
    with pytest.raises(ValueError, match=r"parameter #0 has shape \(48, 32\) here but its saved state 'exp_avg'"):
        opt.load_state_dict(saved)


def test_load_state_dict_of_the_same_model_still_loads(single_rank_group):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    plain = _stepped(torch.nn.Sequential(torch.nn.Linear(8, 4)))
    opt.load_state_dict(plain.state_dict())
    opt.consolidate_state_dict(to=0)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], plain.state_dict()["state"][0]["exp_avg"])
