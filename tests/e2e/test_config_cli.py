"""The config checks through the real ``python train.py``: what a user types and sees.

The module's commands are independent and run together, two at a time (``made``)."""

from __future__ import annotations

import json
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.e2e.runs import summary, train_together
from zero_lab.report.cli import write_report


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, tuple[CompletedProcess[str], Path]]:
    """name -> (result, run or sweep dir) of: a comma list without ``-m``; a manual-partitioning
    sweep over world sizes; a sweep of a plain optimizer over partitioners it does not use; a typo in a
    YAML of the user's own ``--config-dir``; Hydra's ``--cfg`` mode (nothing runs, nothing checked)."""
    base = tmp_path_factory.mktemp("config_cli")
    (base / "mine" / "model").mkdir(parents=True)
    (base / "mine" / "model" / "wide.yaml").write_text("_target_: zero_lab.app.workloads.models.MLP\nhidden: 1024\n")
    commands = {
        "comma": ("optim=adam,zero_adam", f"hydra.run.dir={base / 'comma'}"),
        "manual": ("-m", "partitioner=manual", "dist.world_size=2,4", "steps=2", "logger=none",
                   f"hydra.sweep.dir={base / 'manual'}"),
        "plain": ("-m", "optim=adam", "partitioner=flat,sorted_greedy", "dist.world_size=1", "steps=1", "logger=none",
                  f"hydra.sweep.dir={base / 'plain'}"),
        "mine": ("--config-dir", str(base / "mine"), "model=wide", "model.hiden=3",
                 f"hydra.run.dir={base / 'mine_run'}"),
        "cfg": ("--cfg", "job", "dist.world_size=0", f"hydra.run.dir={base / 'cfg'}"),
    }  # fmt: skip
    return {name: (result, base / name) for name, result in zip(commands, train_together(*commands.values()))}


def test_a_comma_list_without_minus_m_says_to_add_multirun(made):
    result, run_dir = made["comma"]
    assert result.returncode == 2
    assert "optim=adam,zero_adam" in result.stderr and "add -m (--multirun)" in result.stderr
    assert not run_dir.exists()


def test_manual_partitioning_sweeps_over_world_sizes(made):
    result, sweep_dir = made["manual"]
    assert result.returncode == 0, result.stderr[-3000:]
    for job, world in (("0", 2), ("1", 4)):
        run = summary(sweep_dir / job)
        numel = run["partition"]["numel_per_rank"]
        assert (run["world_size"], len(numel), sum(numel)) == (world, world, run["model_params"])
        assert all(n > 0 for n in numel)  # contiguous runs of layers, nobody idle


def test_a_plain_optimizer_says_once_which_overrides_it_does_not_use_and_runs_a_repeat_once(made):
    """``-m optim=adam partitioner=flat,sorted_greedy``: job 0 trains and says partitioner=flat is
    not used (once on the console, once in train.log); job 1 would train the same: not run, noted,
    recorded, and the report lists it under job 0."""
    result, sweep_dir = made["plain"]
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stderr.splitlines() if line.startswith("zero_lab: note:")]
    assert notes == [
        "zero_lab: note: partitioner=flat: not used by torch.optim.Adam, a plain optimizer (every rank keeps the "
        "full state); pick optim=zero_* to shard",
        f"zero_lab: note: partitioner=sorted_greedy: not used by torch.optim.Adam, a plain optimizer, so this job "
        f"trains what {sweep_dir / '0'} trained; not run again (its results stand for both; "
        f"{sweep_dir / '1' / 'repeat_of.json'})",
    ]
    console = result.stdout + result.stderr
    assert console.count("partitioner=flat: not used by") == 1  # one notice per fact (no log-line copy)
    assert (sweep_dir / "0" / "train.log").read_text().count("partitioner=flat: not used by") == 1
    assert summary(sweep_dir / "0")["zero"] is False
    assert console.count("zero_lab: final loss") == 1 and not (sweep_dir / "1" / "summary.json").exists()
    repeat = json.loads((sweep_dir / "1" / "repeat_of.json").read_text())
    assert (repeat["repeat_of"], repeat["not_used"]) == (str(sweep_dir / "0"), ["partitioner=sorted_greedy"])
    out = sweep_dir / "report"
    runs, failed = write_report(sweep_dir, out)
    assert ([r.path.name for r in runs], failed) == (["0"], [])
    assert (
        "- [1](../1/): the same run as `0` (partitioner=sorted_greedy: not used by its optimizer)"
        in (out / "report.md").read_text()
    )
    assert "Repeats (1): merged into the run they repeat" in (out / "report.html").read_text()


def test_a_job_of_the_users_config_dir_is_checked_like_ours(made):
    result, _ = made["mine"]
    assert result.returncode == 2
    assert "model.hiden: no such key; did you mean model.hidden?" in result.stderr  # keys from wide.yaml's _target_
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    assert not (made["mine"][1].parent / "mine_run").exists()


def test_hydras_own_modes_run_nothing_and_check_nothing(made):
    result, run_dir = made["cfg"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world_size: 0" in result.stdout
    assert not run_dir.exists()
