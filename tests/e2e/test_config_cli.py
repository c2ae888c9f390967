"""The config checks through the real ``python train.py``: what a user types and sees."""

from __future__ import annotations

from tests.e2e.runs import summary, train


def test_a_comma_list_without_minus_m_says_to_add_multirun(tmp_path):
    result = train("optim=adam,zero_adam", f"hydra.run.dir={tmp_path / 'run'}", timeout=60)
    assert result.returncode == 2
    assert "optim=adam,zero_adam" in result.stderr and "add -m (--multirun)" in result.stderr
    assert not (tmp_path / "run").exists()


def test_manual_partitioning_sweeps_over_world_sizes(tmp_path):
    result = train(
        "-m", "partitioner=manual", "dist.world_size=2,4", "steps=2", "logger=none", f"hydra.sweep.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job, world in (("0", 2), ("1", 4)):
        run = summary(tmp_path / job)
        numel = run["partition"]["numel_per_rank"]
        assert (run["world_size"], len(numel), sum(numel)) == (world, world, run["model_params"])
        assert all(n > 0 for n in numel)  # contiguous runs of layers, nobody idle


def test_a_plain_optimizer_says_which_overrides_it_does_not_use(tmp_path):
    result = train(
        "optim=adam", "partitioner=flat", "dist.world_size=1", "steps=1", "logger=none", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stderr.splitlines() if line.startswith("zero_lab: note:")]
    assert notes == [
        "zero_lab: note: partitioner=flat: not used by torch.optim.Adam, a plain optimizer (every rank keeps the "
        "full state); pick optim=zero_* to shard"
    ]
    assert summary(tmp_path)["zero"] is False
