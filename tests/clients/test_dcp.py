"""torch.distributed.checkpoint (DCP) with zero_lab, across world sizes and between zero_lab and
plain DDP + AdamW (issue 28): ``zero_lab.dcp``'s ``get_optimizer_state_dict`` /
``set_optimizer_state_dict`` (every partition; plain optimizers pass through to torch's), and
torch's own functions on a ZeRO optimizer with a whole-parameter partition.

Each case trains W_save ranks 3 steps, saves model + optimizer with ``dcp.save`` (zero_lab's
own ``zero_lab.dcp.save``, with its integrity record, for the zero_lab modes), resumes on W_load
ranks (zero_lab's modes and FSDP2 through ``zero_lab.dcp.load``'s checked reader, with or without
a record) and trains 2 more steps; the parameters must be bitwise those of the same save/resume
done with plain DDP + AdamW on both sides.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import state_dict as torch_dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import batch, loss_of, make_model
from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab import dcp as zero_dcp

SAVE_STEPS, MORE_STEPS = 3, 2


@pytest.mark.parametrize(
    ("saver", "save_world", "loader", "load_world"),
    [
        ("zero_torch_api", 2, "plain", 1),  # torch's own functions on zero_lab write, plain DDP + AdamW reads
        ("plain", 2, "zero_torch_api", 3),  # and read
        ("plain", 3, "zero_flat", 2),  # plain writes, zero_lab (Flat: cut parameters) reads
        ("zero_flat", 2, "zero", 3),  # zero_lab at another world size and partitioner
    ],
)
def test_dcp_round_trip_equals_plain_adamw(world, tmp_path, saver, save_world, loader, load_world):
    ours, reference = tmp_path / "ours", tmp_path / "reference"
    world(save, save_world, saver, str(ours))
    world(save, save_world, "plain", str(reference))
    resumed = world(resume, load_world, loader, str(ours))
    expected = world(resume, load_world, "plain", str(reference))
    assert resumed[0]["loaded_state"] == expected[0]["loaded_state"]
    for got, want in zip(resumed, expected):
        assert all(torch.equal(a, b) for a, b in zip(got["params"], want["params"]))


def test_fsdp2_reads_a_zero_lab_checkpoint_exactly(world, tmp_path):
    """FSDP2 (``fully_shard``, DTensor state) loads what zero_lab (Flat: cut parameters) wrote."""
    world(save, 2, "zero_flat", str(tmp_path))
    assert world(fsdp2_load, 2, str(tmp_path)) == [True, None]


def _build(mode: str) -> tuple[DDP, torch.optim.Optimizer]:
    ddp = DDP(make_model())
    kwargs: dict[str, Any] = {"lr": 1e-2, "weight_decay": 0.1}
    if mode == "plain":
        return ddp, torch.optim.AdamW(ddp.parameters(), **kwargs)
    partitioner = Flat() if mode == "zero_flat" else None  # "zero", "zero_torch_api": SortedGreedy
    return ddp, ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, partitioner=partitioner, **kwargs)


def _train(ddp: DDP, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        loss_of(ddp, batch(step, dist.get_rank())).backward()
        opt.step()


def _api(mode: str) -> Any:
    return torch_dcp if mode == "zero_torch_api" else zero_dcp


def save(mode: str, path: str) -> None:
    ddp, opt = _build(mode)
    _train(ddp, opt, range(SAVE_STEPS))
    state = {"model": get_model_state_dict(ddp), "optim": _api(mode).get_optimizer_state_dict(ddp, opt)}
    if mode in ("zero", "zero_flat"):
        zero_dcp.save(state, path)  # with its integrity record
    else:
        dcp.save(state, checkpoint_id=path)


def resume(mode: str, path: str) -> dict[str, Any]:
    ddp, opt = _build(mode)
    state = {"model": get_model_state_dict(ddp), "optim": _api(mode).get_optimizer_state_dict(ddp, opt)}
    if mode in ("zero", "zero_flat"):  # the checked reader, at another world size than the save's
        zero_dcp.load(state, path)
    else:
        dcp.load(state, checkpoint_id=path)
    set_model_state_dict(ddp, state["model"])
    if mode == "zero_torch_api":  # off the target each rank's template holds only its own parameters
        options = torch_dcp.StateDictOptions(strict=False)
        torch_dcp.set_optimizer_state_dict(ddp, opt, state["optim"], options=options)
    else:
        _api(mode).set_optimizer_state_dict(ddp, opt, state["optim"])
    loaded = torch_dcp.get_optimizer_state_dict(ddp, opt)["state"]  # rank 0: the full state
    summary = {fqn: {k: round(float(v.double().sum()), 12) for k, v in s.items()} for fqn, s in loaded.items()}
    _train(ddp, opt, range(SAVE_STEPS, SAVE_STEPS + MORE_STEPS))
    return {"params": [p.detach().clone() for p in ddp.parameters()], "loaded_state": summary}


def fsdp2_load(path: str) -> bool | None:
    """Load ``path`` into FSDP2 + AdamW and into DDP + AdamW; rank 0: are the full states equal (and loaded)?"""
    states = []
    for kind in ("fsdp2", "plain"):
        if kind == "fsdp2":
            model = make_model()
            fully_shard(model)
            opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        else:
            model, opt = _build("plain")
        state = {"model": get_model_state_dict(model), "optim": torch_dcp.get_optimizer_state_dict(model, opt)}
        zero_dcp.load(state, path)  # the checked reader, into DTensor (FSDP2) and plain templates
        set_model_state_dict(model, state["model"])
        torch_dcp.set_optimizer_state_dict(model, opt, state["optim"])
        full = torch_dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        states.append(torch_dcp.get_optimizer_state_dict(model, opt, options=full).get("state"))
    if dist.get_rank() != 0:
        return None
    fsdp2, plain = states
    same = all(torch.equal(fsdp2[fqn][key], value) for fqn, entry in plain.items() for key, value in entry.items())
    loaded = all(float(entry["step"]) == SAVE_STEPS for entry in plain.values())  # not a fresh state
    return fsdp2.keys() == plain.keys() and same and loaded
