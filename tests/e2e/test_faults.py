"""Issue 15 end to end, each case reproduced with the real ``python train.py``: concurrent jobs,
a SIGKILLed rank, tampered / renamed checkpoints, resumes across optimizers and
hyper-parameters, a diverging loss, and W&B online without a server. Runs are shared
between assertions where one run shows several things, and independent runs are made
together, two at a time (``first_runs``, ``resumes``)."""

from __future__ import annotations

import datetime
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.runs import (
    REPO,
    assert_no_leftover_processes,
    child_env,
    metrics,
    summary,
    together,
    train,
    train_together,
)
from tests.e2e.test_app_faults import FOREVER, start, wait_for

CKPT = "checkpoint_every=1"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def first_runs(base) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """Made together: ZeRO-Adam (lr 0.001), 4 steps, a checkpoint after every step, only the 2
    newest kept; and a run whose loss diverges (``optim.lr=1e30``: finite, but it blows up)."""
    adam, diverged = base / "adam", base / "diverged"
    made, failed = train_together(
        ("logger=none", "steps=4", CKPT, "keep_checkpoints=2", f"hydra.run.dir={adam}"),
        ("logger=none", "optim.lr=1e30", "steps=8", CKPT, f"hydra.run.dir={diverged}"),
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return adam, diverged, failed


@pytest.fixture(scope="module")
def adam_run(first_runs) -> Path:
    return first_runs[0]


def copy_checkpoint(adam_run: Path, to: Path) -> Path:
    shutil.copytree(adam_run / "checkpoints" / "step_00000003", to)
    return to


def resume_cases(base: Path, adam_run: Path) -> dict[str, tuple[str, ...]]:
    """The resumes of ``adam_run`` checked below (``resumes`` makes the checkpoint copies)."""
    return {
        "corrupted": ("logger=none", "optim=adam", "steps=5", f"resume={base / 'corrupted' / 'step_00000003'}"),
        "renamed": ("logger=none", "steps=5", f"resume={base / 'renamed' / 'step_00000002'}"),
        "best": ("logger=none", "steps=3", f"resume={base / 'best'}"),
        "other_class": ("logger=none", "optim=zero_sgd", "steps=5", f"resume={adam_run}"),
        "changed_lr": ("logger=none", "optim.lr=0.05", "steps=5", f"resume={adam_run}"),
        "reset": ("logger=none", "optim=sgd", "steps=5", f"resume={adam_run}", "resume_optimizer=reset"),
        # the changed lr with the override on record, logged to W&B "online" against a server that
        # is not there (see ``resumes``): the init gives up after logger.init_timeout_s and logs offline
        "override": ("optim.lr=0.05", "steps=5", f"resume={adam_run}", "resume_optimizer=override", "logger=wandb",
                     "logger.mode=online", "logger.init_timeout_s=2"),
    }  # fmt: skip


@pytest.fixture(scope="module")
def resumes(base, adam_run) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every case of :func:`resume_cases` run together (2 at a time): name -> (result, run dir)."""
    model = copy_checkpoint(adam_run, base / "corrupted" / "step_00000003") / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    model.write_bytes(bytes(data))
    copy_checkpoint(adam_run, base / "renamed" / "step_00000002")
    copy_checkpoint(adam_run, base / "best")  # copied under another name: the manifest's step counts
    offline_server = child_env() | {"WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}
    calls = [
        functools.partial(
            train,
            *args,
            f"hydra.run.dir={base / 'runs' / name}",
            env=offline_server if name == "override" else None,
        )
        for name, args in resume_cases(base, adam_run).items()
    ]
    results = together(*calls)
    return {name: (result, base / "runs" / name) for name, result in zip(resume_cases(base, adam_run), results)}


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The run must have failed with one ``zero_lab:`` message and no traceback; its stderr."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stderr


def test_keep_checkpoints_prunes_all_but_the_newest(adam_run):
    assert sorted(p.name for p in (adam_run / "checkpoints").iterdir()) == ["step_00000003", "step_00000004"]


def test_a_corrupted_model_pt_resumed_with_a_plain_optimizer_is_refused(resumes, base):
    stderr = refused(resumes["corrupted"][0])
    assert f"checkpoint {base / 'corrupted' / 'step_00000003'} is corrupt: model.pt" in stderr


def test_a_renamed_checkpoint_is_refused(resumes, base):
    stderr = refused(resumes["renamed"][0])
    assert "its name says step 2 but it holds step 3" in stderr
    stderr = refused(resumes["best"][0])
    assert f"{base / 'best'} is at step 3; steps=3 leaves nothing to run" in stderr


def test_resuming_with_another_optimizer_class_names_both(resumes):
    stderr = refused(resumes["other_class"][0])
    assert "holds the state of torch.optim.Adam; this run builds torch.optim.SGD" in stderr
    assert "resume_optimizer=reset" in stderr


def test_changed_hyperparameters_are_refused_or_overridden_on_record(resumes):
    stderr = refused(resumes["changed_lr"][0])
    assert "group0.lr: 0.001 in the checkpoint, 0.05 here" in stderr and "resume_optimizer=override" in stderr

    result, run_dir = resumes["override"]
    assert result.returncode == 0, result.stderr[-3000:]
    done = summary(run_dir)
    assert (done["start_step"], done["resume_optimizer"]) == (4, "override")
    assert done["resume_overridden"] == {"group0.lr": [0.001, 0.05]}
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["resume_optimizer"] == "override"
    notices = [line for line in result.stderr.splitlines() if "W&B online init failed" in line]
    assert len(notices) == 1 and "logging offline" in notices[0] and "Traceback" not in result.stderr
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def test_a_plain_optimizer_of_another_class_resumes_with_reset(resumes):
    result, run_dir = resumes["reset"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert (summary(run_dir)["start_step"], summary(run_dir)["resume_optimizer"]) == (4, "reset")


def test_a_non_finite_loss_stops_the_run_keeping_the_last_good_checkpoint(first_runs):
    _, run_dir, result = first_runs
    assert result.returncode == 1, result.stderr[-3000:]
    step = int(re.search(r"non-finite loss at step (\d+)", result.stderr).group(1))
    assert f"last good checkpoint: {run_dir}/checkpoints/step_{step:08d}" in result.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1] == f"step_{step:08d}"

    def strict(constant: str):
        raise ValueError(f"bare {constant}")

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=strict) for line in lines]
    assert records[-1]["step"] == step and records[-1]["train/loss"] is None
    assert metrics(run_dir)[:-1] and all(r["train/loss"] is not None for r in records[:-1])


def rank_pid(run_dir: Path, rank: int) -> int:
    log = run_dir / "logs" / f"rank{rank}.log"
    return int(re.search(r", pid (\d+),", log.read_text()).group(1))


def test_one_explicit_run_dir_refuses_a_second_job_and_a_sigkilled_rank_is_blamed(tmp_path):
    run_dir = tmp_path / "shared"
    first = start(run_dir, FOREVER)
    wait_for(run_dir / "metrics.jsonl", first)
    second = train("logger=none", "steps=2", f"hydra.run.dir={run_dir}")
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"run dir {run_dir} is in use by another running job (pid {first.pid})" in second.stderr

    victim = rank_pid(run_dir, 1)
    subprocess.run(["kill", "-9", str(victim)], check=True)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 1, stderr[-3000:]
    assert "rank 1 failed: its process was killed by SIGKILL (exit code -9)" in stderr
    assert f"its log: {run_dir}/logs/rank1.log" in stderr
    assert_no_leftover_processes()


def test_two_default_jobs_started_at_once_get_their_own_run_dirs(tmp_path):
    # Another job holds every default dir of the next 3 minutes, so the clash is certain (not a
    # matter of both jobs resolving ${now:} in the same second); then two jobs start at once.
    now = datetime.datetime.now()
    taken = [tmp_path / "outputs" / f"{t:%Y-%m-%d}" / f"{t:%H-%M-%S}" for t in
             (now + datetime.timedelta(seconds=s) for s in range(180))]  # fmt: skip
    for directory in taken:
        directory.mkdir(parents=True, exist_ok=True)
    # One rank each: what is shared is the default run dir, not the world (6 processes importing torch at
    # once on a 2-core runner would only make the test slow).
    command = [sys.executable, str(REPO / "train.py"), "logger=none", "steps=2", "dist.world_size=1"]
    jobs = [
        subprocess.Popen(command, cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for _ in range(2)
    ]  # fmt: skip
    for job in jobs:
        _, stderr = job.communicate(timeout=240)
        assert job.returncode == 0, stderr[-3000:]
    assert [d for d in taken if any(d.iterdir())] == []  # nothing written into another job's dir
    run_dirs = sorted(p.parent for p in tmp_path.glob("outputs/*/*/summary.json"))
    assert len(run_dirs) == 2 and all(re.search(r"-\d+$", d.name) for d in run_dirs)
    for run_dir in run_dirs:
        assert [r["step"] for r in metrics(run_dir)] == [0, 1]  # one job per dir, no interleaving
        assert summary(run_dir)["steps"] == 2
    assert_no_leftover_processes()
