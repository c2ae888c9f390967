"""Drop-in fidelity, pinned: the public names of torch's ``ZeroRedundancyOptimizer`` and the
private ones code written for it reads are all on zero_lab's class, and read the same.

If torch drops or renames one of these, the first test fails on torch's side and the list is
updated on purpose; if zero_lab loses one (as ``_all_params`` was lost to a rename), the
second fails.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab.torch_compat import TORCH_PRIVATE_NAMES

#: Public methods and attributes of torch's class (beyond ``torch.optim.Optimizer``'s).
PUBLIC = (
    "step",
    "zero_grad",
    "state_dict",
    "load_state_dict",
    "consolidate_state_dict",
    "add_param_group",
    "join_hook",
    "join_device",
    "join_process_group",
    "param_groups",
    "defaults",
    "state",
    "optim",
    "process_group",
    "world_size",
    "rank",
    "global_rank",
    "parameters_as_bucket_view",
)


def _pair() -> tuple[list[torch.nn.Parameter], TorchZero, ZeroRedundancyOptimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    params = list(model.parameters())
    return (
        params,
        TorchZero(params, torch.optim.Adam, lr=1e-3),
        ZeroRedundancyOptimizer(params, torch.optim.Adam, lr=1e-3),
    )


def _has(obj: object, name: str) -> bool:
    """``hasattr`` without evaluating properties (some of torch's assert on their use)."""
    return name in vars(obj) or any(name in vars(klass) for klass in type(obj).__mro__)


@pytest.mark.parametrize("name", PUBLIC + TORCH_PRIVATE_NAMES)
def test_torch_has_the_pinned_name(single_rank_group, name):
    _, theirs, _ = _pair()
    assert _has(theirs, name), f"torch's ZeroRedundancyOptimizer no longer has {name}: update the pinned list"


@pytest.mark.parametrize("name", PUBLIC + TORCH_PRIVATE_NAMES)
def test_zero_lab_has_the_pinned_name(single_rank_group, name):
    _, _, ours = _pair()
    assert _has(ours, name), f"zero_lab's ZeroRedundancyOptimizer lacks torch's {name}"


def test_private_maps_read_like_torchs(single_rank_group):
    params, theirs, ours = _pair()
    assert ours._all_params == theirs._all_params == params
    assert ours._index_to_param == theirs._index_to_param
    assert ours._param_to_index == theirs._param_to_index
    assert ours._param_to_rank == theirs._param_to_rank
    assert ours.initialized is theirs.initialized is True
    theirs_parts = theirs._partition_parameters()
    ours_parts = ours._partition_parameters()

    def ids(parts: list[list[dict]]) -> list[list[set[int]]]:  # torch lists a rank's params largest first
        return [[{id(p) for p in g["params"]} for g in rank] for rank in parts]

    assert ids(ours_parts) == ids(theirs_parts)
    assert [[g["lr"] for g in rank] for rank in ours_parts] == [[g["lr"] for g in rank] for rank in theirs_parts]
    assert ours._device_to_params_per_rank == {torch.device("cpu"): [params]}


def test_a_split_parameter_has_no_single_owner_and_says_so(single_rank_group):
    ours = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.zeros(10))], torch.optim.Adam, partitioner=Flat(), lr=1)
    assert ours._all_params == ours.all_params  # still served: it does not depend on owners
    if ours.partition.is_whole:  # one rank: Flat's single range is the whole parameter
        assert ours._param_to_rank == {ours.all_params[0]: 0}
    with pytest.raises(ValueError, match=r"partitioner=zero_lab.Manual"):
        ours._partition_parameters([[ours.all_params[0]]])
