"""Sharded checkpoints: resume at other world sizes and partitioners, export, corruption, faults."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import loss_of, make_model
from tests.e2e.runs import process_alive
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.checkpoint import export_plain_state_dict, latest_checkpoint, read_manifest
from zero_lab.partition import Flat, Partitioner
from zero_lab.runtime.spawn import RankFailure

SAVE_AT, TOTAL = 4, 9


@pytest.fixture(scope="module")
def saved(world, tmp_path_factory):
    """Uninterrupted W=2 sorted-greedy runs (one per partitioner), each saving at step 4."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, partitioner in (("sorted_greedy", None), ("flat", Flat())):
        directory = root / name / "step_00000004"
        losses = world(train_and_save, 2, str(directory), partitioner, SAVE_AT, TOTAL)[0]
        out[name] = (directory, losses)
    return out


def test_checkpoint_layout_and_manifest(saved):
    directory, _ = saved["sorted_greedy"]
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json",
        "model.pt",
        "optim-rank00000.pt",
        "optim-rank00001.pt",
    ]
    manifest = read_manifest(directory)
    assert manifest["world_size"] == 2 and manifest["extra"] == {"step": SAVE_AT}
    assert len(manifest["params"]) == 8
    assert not list(directory.parent.glob(".*partial*"))
    assert latest_checkpoint(directory.parent) == directory


@pytest.mark.parametrize(
    ("source", "world_size", "partitioner"),
    [
        ("sorted_greedy", 2, None),
        ("sorted_greedy", 3, None),
        ("sorted_greedy", 1, None),
        ("sorted_greedy", 2, Flat()),
        ("flat", 3, None),
        ("flat", 4, Flat(bucket_cap_mb=1e-4)),  # resumed into many ~100-byte buffers
    ],
    ids=["W2", "W2->3", "W2->1", "greedy->flat", "flat->greedy-W3", "flat-W2->W4-buffers"],
)
def test_resume_reshards_and_continues_exactly(world, saved, tmp_path, source, world_size, partitioner):
    directory, uninterrupted = saved[source]
    resumed = world(resume_and_train, world_size, str(directory), partitioner, TOTAL)[0]
    # Against the uninterrupted W=2 run: equal up to float summation order across world sizes.
    tolerance = 0.0 if (world_size, partitioner, source) == (2, None, "sorted_greedy") else 1e-5
    assert resumed == pytest.approx(uninterrupted[SAVE_AT:], rel=tolerance, abs=tolerance)
    # Against DDP + plain Adam at the new world size from the exported state: same arithmetic.
    exported = export_plain_state_dict(directory, tmp_path / "plain.pt")
    reference = world(plain_from_export, world_size, str(directory / "model.pt"), str(exported), SAVE_AT, TOTAL)[0]
    assert resumed == pytest.approx(reference, rel=1e-6, abs=1e-7)


def test_exported_plain_state_loads_into_torch_adam(saved, tmp_path):
    directory, _ = saved["flat"]
    path = export_plain_state_dict(directory, tmp_path / "adam.pt")
    state = torch.load(path, weights_only=True)
    model = make_model()
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    adam.load_state_dict(state)
    for param in model.parameters():
        assert adam.state[param]["exp_avg"].shape == param.shape
        assert adam.state[param]["step"].item() == SAVE_AT


def test_truncated_shard_gets_a_clear_error(world, saved, tmp_path):
    import shutil

    broken = tmp_path / "step_00000004"
    shutil.copytree(saved["sorted_greedy"][0], broken)
    shard = broken / "optim-rank00001.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    rank0, rank1 = world(load_expecting_error, 2, str(broken))
    assert "is corrupt: optim-rank00001.pt has 100 bytes" in rank1
    assert rank0 == "no error"  # rank 0's shards do not overlap that file, so it never reads it


def test_checkpoint_without_manifest_is_never_used(world, saved, tmp_path):
    import shutil

    partial = tmp_path / "step_00000008"
    shutil.copytree(saved["sorted_greedy"][0], partial)
    (partial / "manifest.json").unlink()
    assert latest_checkpoint(tmp_path) is None
    for message in world(load_expecting_error, 2, str(partial)):
        assert "not a complete zero_lab checkpoint" in message


def test_a_raising_rank_ends_the_world_named_and_leaves_no_process(world, tmp_path):
    """Bounded by the failure, not a clock: the peers wait in a barrier whose timeout (an hour)
    is past the test's own, so only the launcher's fail-fast can end this world in time."""
    with pytest.raises(RankFailure) as failure:
        world(raise_on_rank, 3, 1, str(tmp_path), timeout_s=3600)
    assert failure.value.rank == 1
    assert "injected failure on rank 1" in str(failure.value)
    assert "Timed out" not in str(failure.value)  # no collective timed out on the way
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == 3
    assert [pid for pid in pids if process_alive(pid)] == []


# ---------------------------------------------------------------- rank programs
# ---------------------------------------------------------------- checkpoints
GLOBAL_BATCH = 12  # divisible by every world size the tests use (1, 2, 3, 4)


def global_batch_slice(step: int) -> torch.Tensor:
    """This rank's rows of the step's global batch: the trajectory is the same at any world size."""
    g = torch.Generator().manual_seed(7000 + step)
    x = torch.randn(GLOBAL_BATCH, 12, generator=g)
    return x[dist.get_rank() :: dist.get_world_size()]


def _global_loss(ddp: nn.Module, step: int) -> torch.Tensor:
    loss = loss_of(ddp, global_batch_slice(step))
    loss.backward()
    reported = loss.detach().clone()
    dist.all_reduce(reported)
    return reported / dist.get_world_size()


def _train_steps(ddp: nn.Module, opt: torch.optim.Optimizer, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last):
        opt.zero_grad()
        losses.append(_global_loss(ddp, step).item())
        opt.step()
    return losses


def train_and_save(directory: str, partitioner: Partitioner | None, save_at: int, total: int) -> list[float]:
    """Train ``total`` steps, saving a sharded checkpoint after ``save_at``; every step's loss."""
    from zero_lab.checkpoint import save_checkpoint

    model = make_model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
    losses = _train_steps(ddp, opt, 0, save_at)
    save_checkpoint(directory, opt, model, extra={"step": save_at})
    return losses + _train_steps(ddp, opt, save_at, total)


def resume_and_train(directory: str, partitioner: Partitioner | None, total: int) -> list[float]:
    """Load a checkpoint saved at any world size / partitioner and train to ``total``."""
    from zero_lab.checkpoint import load_checkpoint

    model = make_model(seed=99)  # different init: everything must come from the checkpoint
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
    extra = load_checkpoint(directory, opt, model)
    ddp = DDP(model)
    return _train_steps(ddp, opt, extra["step"], total)


def plain_from_export(model_file: str, optim_file: str, first: int, total: int) -> list[float]:
    """DDP + plain Adam from the exported plain state: the reference for a resharded resume."""
    model = make_model(seed=99)
    model.load_state_dict(torch.load(model_file, weights_only=True))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt.load_state_dict(torch.load(optim_file, weights_only=True))
    return _train_steps(DDP(model), opt, first, total)


def load_expecting_error(directory: str) -> str:
    from zero_lab.checkpoint import CheckpointError, load_checkpoint

    model = make_model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    try:
        load_checkpoint(directory, opt, model)
    except CheckpointError as error:
        return str(error)
    return "no error"


def raise_on_rank(bad_rank: int, pid_dir: str) -> str:
    """Rank ``bad_rank`` raises while the others wait in a collective; each rank leaves its pid."""
    import os

    with open(f"{pid_dir}/rank{dist.get_rank()}.pid", "w") as handle:
        handle.write(str(os.getpid()))
    dist.barrier()
    if dist.get_rank() == bad_rank:
        raise ValueError(f"injected failure on rank {bad_rank}")
    dist.barrier()  # blocks until the launcher kills this rank
    return "unreachable"
