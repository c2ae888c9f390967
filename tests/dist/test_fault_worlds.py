"""Faults in Gloo worlds: a rank killed with SIGKILL is the one blamed (not the peer whose
collective saw the connection drop), and two writers publishing the same checkpoint at
once never leave a broken one (issue 15, items 1 and 2)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.dist.worlds import run_ranks
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.checkpoint import load_checkpoint, save_checkpoint
from zero_lab.runtime.spawn import RankFailure


def sigkill_rank(bad_rank: int) -> str:
    """Rank ``bad_rank`` SIGKILLs itself while the others wait in an all-reduce."""
    dist.barrier()
    if dist.get_rank() == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))  # the survivors' Gloo error: "Connection reset by peer" or similar
    return "unreachable"


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_rank_killed_by_sigkill_is_blamed_not_its_peers(world, world_size):
    with pytest.raises(RankFailure) as caught:
        world(sigkill_rank, world_size, 1, timeout_s=30)
    failure = caught.value
    assert (failure.rank, failure.exitcode) == (1, -signal.SIGKILL)
    assert "killed by SIGKILL (exit code -9) before reporting" in failure.details
    assert 0 in failure.others  # rank 0's collective error is kept, as an echo


def publish_repeatedly(directory: str, value: float, rounds: int) -> str:
    """A one-rank world saving the same checkpoint ``rounds`` times, its weights all ``value``."""
    model = torch.nn.Linear(64, 64)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(value)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    model(torch.ones(1, 64)).sum().backward()
    opt.step()
    for _ in range(rounds):
        save_checkpoint(directory, opt, model)
    return "saved"


def test_two_writers_publishing_one_checkpoint_leave_a_complete_one(tmp_path, single_rank_group):
    directory = tmp_path / "step_00000001"
    outcomes: dict[float, object] = {}

    def writer(value: float) -> None:
        try:
            outcomes[value] = run_ranks(publish_repeatedly, 1, str(directory), value, 25, timeout_s=60)
        except Exception as error:  # reported below, with the other writer's outcome
            outcomes[value] = error

    threads = [threading.Thread(target=writer, args=(v,)) for v in (1.0, 2.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert outcomes == {1.0: ["saved"], 2.0: ["saved"]}, outcomes
    model = torch.nn.Linear(64, 64)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    load_checkpoint(directory, opt, model)  # sizes + sha256 of every file checked
    values = torch.cat([p.detach().flatten() for p in model.parameters()]).unique().tolist()
    assert values in ([pytest.approx(0.999)], [pytest.approx(1.999)])  # one writer's weights, not a mix
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["step_00000001"]  # no partial or stale copy
