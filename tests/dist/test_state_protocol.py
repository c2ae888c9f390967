"""The state-dict protocol the training-loop clients rely on (issue 28), on W=2 Gloo worlds.

* rank 0 alone calls ``state_dict()`` (HF Trainer): it gets the full state, equal to DDP + Adam's;
* every rank calls it (accelerate): rank 0 the full state, rank 1 its own shard, which loads
  back into rank 1 and is refused on rank 0 (it would lose rank 0's state);
* ``consolidate_state_dict`` on every rank, then ``state_dict`` on rank 0 (Lightning);
* ``opt.state`` holds exactly this rank's shards, keyed by parameter.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import batch, loss_of, make_model
from zero_lab import Flat, ZeroRedundancyOptimizer


@pytest.mark.parametrize("flat", [False, True])
def test_full_state_on_rank_0_alone_equals_adams(world, flat):
    rows = world(save_like_clients, 2, flat)
    for row in rows:
        assert row["lone_rank0_equal"] is True
        assert row["consolidated_equal"] is True
        assert row["freed_then_fetched"] is True
        assert row["state_keys_are_own_shards"] is True
    assert [row["all_state_dicts"] for row in rows] == [2, 0]
    assert rows[0]["all_ranks_answer"] == "full"
    assert rows[1]["all_ranks_answer"] == "shard of rank 1"
    assert rows[1]["own_shard_round_trip"] is True
    assert rows[0]["foreign_shard_refused"].startswith("load_state_dict got rank 1's shard of a 2-rank optimizer")
    assert rows[0]["empty_refused"].startswith("load_state_dict got a state dict without 'param_groups'")


def _train(opt: torch.optim.Optimizer, ddp: DDP, steps: int) -> None:
    for step in range(steps):
        opt.zero_grad()
        loss_of(ddp, batch(step, dist.get_rank())).backward()
        opt.step()


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(
        all(torch.equal(a[i][k], b[i][k]) if torch.is_tensor(a[i][k]) else a[i][k] == b[i][k] for k in a[i]) for i in a
    )


def save_like_clients(flat: bool) -> dict[str, Any]:
    rank = dist.get_rank()
    plain_ddp = DDP(make_model())
    plain = torch.optim.Adam(plain_ddp.parameters(), lr=1e-2)
    _train(plain, plain_ddp, 3)
    expected = plain.state_dict()["state"]

    ddp = DDP(make_model())
    partitioner = Flat() if flat else None
    opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
    _train(opt, ddp, 3)
    row: dict[str, Any] = {}
    owned = {id(s.param) for s in opt.local_shards()}
    row["state_keys_are_own_shards"] = {id(p) for p in opt.state} == owned and all(
        opt.state[s.param]["exp_avg"].numel() == s.stop - s.start for s in opt.local_shards()
    )
    # HF Trainer: rank 0 alone, while rank 1 waits in the next collective
    if rank == 0:
        row["lone_rank0_equal"] = _same(opt.state_dict()["state"], expected)
    else:
        row["lone_rank0_equal"] = True
    dist.barrier()
    # accelerate: every rank calls it
    answer = opt.state_dict()
    shard = answer.get("zero_lab_shard")
    row["all_ranks_answer"] = "full" if shard is None else f"shard of rank {shard['rank']}"
    shards = [None, None]
    dist.all_gather_object(shards, answer)
    if rank == 1:
        before = {i: dict(v) for i, v in opt.state_dict()["state"].items()}
        opt.load_state_dict(answer)
        row["own_shard_round_trip"] = _same(opt.state_dict()["state"], before)
    else:
        try:
            opt.load_state_dict(shards[1])
            row["foreign_shard_refused"] = "loaded"
        except ValueError as error:
            row["foreign_shard_refused"] = str(error)
        try:
            opt.load_state_dict({})
            row["empty_refused"] = "loaded"
        except ValueError as error:
            row["empty_refused"] = str(error)
    # Lightning: consolidate on every rank, state_dict on rank 0
    opt.consolidate_state_dict()
    row["consolidated_equal"] = _same(opt.state_dict()["state"], expected) if rank == 0 else True
    row["all_state_dicts"] = len(opt._all_state_dicts)  # torch's name for the consolidated copy
    opt._all_state_dicts = []  # code written for torch's class frees it so
    row["freed_then_fetched"] = _same(opt.state_dict()["state"], expected) if rank == 0 else True
    dist.barrier()
    return row
