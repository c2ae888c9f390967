"""End-to-end: the real ``python train.py`` (Hydra, spawned Gloo ranks, torchrun, W&B offline).

Kept small: tiny models, few steps; the default run and the 2-job sweep are made once per
session (``conftest.py``) and shared with other modules.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.runs import (
    REPO,
    SUMMARY_KEYS,
    TORCHRUN,
    assert_close,
    assert_no_leftover_processes,
    child_env,
    metrics,
    runs_once,
    summary,
    train,
    wandb_records,
)
from tests.registries import assert_auto_rule


# ----------------------------------------------------------------------------- the default run
def test_default_run_writes_the_outputs_contract(default_run):
    assert f"run dir: {default_run}" in (default_run / ".done").read_text()
    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        assert (default_run / ".hydra" / name).is_file()
    result = summary(default_run)
    assert result.keys() >= SUMMARY_KEYS
    assert (result["world_size"], result["steps"], len(result["losses"])) == (2, 20, 20)
    assert result["final_loss"] == result["losses"][-1] < result["losses"][0]
    assert len(result["param_checksum"]) == 64
    rows = metrics(default_run)
    assert [row["step"] for row in rows] == list(range(20))
    assert_close([row["train/loss"] for row in rows], result["losses"], 0.0)
    assert result["choices"]["optim"] == "zero_adam" and result["zero"] is True


def test_default_run_has_rank_logs_meta_and_one_wandb_run(default_run):
    for rank in (0, 1):
        assert "done: final loss" in (default_run / "logs" / f"rank{rank}.log").read_text()
    meta = json.loads((default_run / "meta.json").read_text())
    assert len(meta["git"]["rev"]) == 40 and meta["command"] == "python train.py"
    assert len(list(default_run.glob("wandb/offline-run-*/run-*.wandb"))) == 1


# ----------------------------------------------------------------------------- sweeps
def test_sweep_jobs_get_their_own_dirs(sweep):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    assert [summary(p)["choices"]["optim"] for p in jobs] == ["adam", "zero_adam"]
    for job in jobs:
        assert len(metrics(job)) == 6
    # plain Adam: rank 0 saves the full state; ZeRO: the core's sharded format, one file per rank
    plain = ["step_00000003.pt", "step_00000003.pt.sha256.json", "step_00000006.pt", "step_00000006.pt.sha256.json"]
    assert sorted(c.name for c in (sweep / "0" / "checkpoints").iterdir()) == plain  # each with its size + sha256
    files = ["manifest.json", "model.pt", "optim-rank00000.pt", "optim-rank00001.pt"]
    assert sorted(c.name for c in (sweep / "1" / "checkpoints" / "step_00000003").iterdir()) == files


def test_zero_adam_matches_plain_adam_through_the_app(sweep):
    adam, zero = summary(sweep / "0"), summary(sweep / "1")
    assert_close(zero["losses"], adam["losses"], 1e-6)
    assert zero["param_checksum"] == adam["param_checksum"]  # same arithmetic: bitwise equal


#: Resumes of the sweep's step-3 checkpoints as ZeRO-Adam: test id -> (sweep job, checkpoint).
#: The ``runs`` fixture makes six ``train.py`` runs, two at a time, in the first test that asks for it:
#: about a minute on an idle machine, more beside other workers; 900 s still bounds a hang.
pytestmark = pytest.mark.timeout(900)

RESUMES = {"sharded-zero": ("1", "step_00000003"), "plain-adam-into-zero": ("0", "step_00000003.pt")}


#: The overlap runs compared with the sweep's ZeRO-Adam job: test id -> overrides.
OVERLAPS = {
    "zero_step": ("overlap=true",),
    "ddp_bucket-interleaved": ("overlap=true", "partitioner=ddp_bucket", "partitioner.shard_buckets=true",
                               "overlap_hook=interleaved"),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(sweep, tmp_path_factory) -> dict[str, Path]:
    """This module's runs that need nothing but the session's, made together, two at a time
    (:func:`~tests.e2e.runs.runs_once`): run (or sweep) dirs by name.

    - ``resumed``: every resume of :data:`RESUMES` as one ``-m resume=A,B`` sweep (job ``i``: the ``i``-th);
    - ``overlap-<id>``: ZeRO-Adam with each of :data:`OVERLAPS`, 6 steps like the sweep;
    - ``ddp-auto``: the default job on the DDP path (``dp=ddp``: ``exchange=auto`` times its candidates);
    - ``prefetch``: the default job on DDP with ``exchange=broadcast prefetch=true``.

    Clipping and bf16 are test_app_precision.py's runs, Muon's test_app_muon.py's and
    test_engine_muon_app.py's: modules of their own, so that the workers share them out.
    """
    sources = ",".join(str(sweep / job / "checkpoints" / checkpoint) for job, checkpoint in RESUMES.values())
    quiet = ("logger=none",)
    made = {
        "resumed": ((*quiet, "optim=zero_adam", "steps=6", f"resume={sources}"), True),
        **{f"overlap-{case}": ((*quiet, "optim=zero_adam", *overrides, "steps=6"), False)
           for case, overrides in OVERLAPS.items()},
        "ddp-auto": (("dp=ddp",), False),
        "prefetch": ((*quiet, "dp=ddp", "exchange=broadcast", "prefetch=true"), False),
    }  # fmt: skip
    return runs_once(tmp_path_factory.getbasetemp() / "test_app", made)


@pytest.mark.parametrize("case", list(RESUMES))
def test_resume_continues_exactly_like_the_uninterrupted_run(sweep, runs, case):
    job, checkpoint = RESUMES[case]
    uninterrupted, run_dir = sweep / job, runs["resumed"] / str(list(RESUMES).index(case))
    ran = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert ran["resume"] == str(uninterrupted / "checkpoints" / checkpoint)  # the job resumed what this case names
    resumed_summary, original = summary(run_dir), summary(uninterrupted)
    assert (resumed_summary["start_step"], resumed_summary["choices"]["optim"]) == (3, "zero_adam")
    assert resumed_summary["losses"] == original["losses"]  # every later step equal, bit for bit
    assert resumed_summary["param_checksum"] == original["param_checksum"]
    assert [row["step"] for row in metrics(run_dir)] == [3, 4, 5]


def test_joblib_sweep_gives_the_same_trajectory_at_any_world_size(tmp_path):
    result = train(
        "-m",
        "dist.world_size=1,2",
        "hydra/launcher=joblib",
        "logger=none",
        "steps=4",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = summary(tmp_path / "0"), summary(tmp_path / "1")
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert_close(one["losses"], two["losses"], 1e-5)  # same global batch; only float rounding differs
    assert_no_leftover_processes()


@pytest.mark.parametrize("case", list(OVERLAPS))
def test_overlap_matches_the_plain_zero_step(case, sweep, runs):
    run_dir = runs[f"overlap-{case}"]
    ran = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    assert set(OVERLAPS[case]) <= set(ran)  # the run this case names
    assert_close(summary(run_dir)["losses"], summary(sweep / "1")["losses"], 1e-6)
    assert metrics(run_dir)[-1]["comm/exchange_bytes/max"] > 0  # the hook's exchange is metered


# ----------------------------------------------------------------------------- torchrun
def _one_run_dir(parent: Path) -> Path:
    dirs = [p for p in parent.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def torchrun(launcher_args: str, *args: str) -> subprocess.Popen[str]:
    """``torchrun <launcher_args> train.py *args`` from the repo root, output captured."""
    return subprocess.Popen(
        [TORCHRUN, *launcher_args.split(), "train.py", *args],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(*procs: subprocess.Popen[str]) -> None:
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs), [out[-3000:] for out in outputs]


def test_torchrun_single_node_writes_one_run_dir(sweep, tmp_path):
    # ${now:...%f} differs between ranks, so one dir proves rank 0's choice was broadcast.
    run_dir = f"hydra.run.dir={tmp_path}/" + "${now:%H-%M-%S-%f}"
    finish(torchrun("--standalone --nproc_per_node 2", "optim=zero_adam", "logger=none", "steps=6", run_dir))
    run_dir = _one_run_dir(tmp_path)
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert "done: final loss" in (run_dir / "logs" / "rank1.log").read_text()  # not silenced by Hydra
    result = summary(run_dir)
    assert result["world_size"] == 2
    assert_close(result["losses"], summary(sweep / "1")["losses"], 1e-6)  # same job as under run_world


def test_torchrun_two_nodes_on_localhost_write_one_run_dir(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rdzv = f"--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:{port} --rdzv_id t{port}"
    run_dir = f"hydra.run.dir={tmp_path}/" + "${now:%H-%M-%S-%f}"
    finish(*(torchrun(f"{rdzv} --node_rank {node}", "logger=none", "steps=3", run_dir) for node in (0, 1)))
    run_dir = _one_run_dir(tmp_path)
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert summary(run_dir)["world_size"] == 2
    assert_no_leftover_processes()


# ----------------------------------------------------------------------------- failures
@pytest.mark.parametrize(
    ("override", "fragment"),
    [("overlap=maybe", "true or false"), ("dist.world_size=0", ">= 1"), ("optim.lr=abc", "expected a number")],
)
def test_bad_input_exits_2_with_one_message_and_starts_nothing(override, fragment, tmp_path):
    result = train(override, f"hydra.run.dir={tmp_path / 'run'}", timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("zero_lab: invalid config (1 problem):")
    assert override in result.stderr and fragment in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 2
    assert not (tmp_path / "run").exists()  # failed before Hydra made a run dir


def test_a_failing_rank_stops_the_world_with_a_short_message(tmp_path):
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"not a checkpoint")
    result = train("logger=wandb", "steps=3", f"resume={bogus}", f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert result.returncode == 1
    assert "failed:" in result.stderr and "full traceback:" in result.stderr
    assert "Traceback" not in result.stderr
    assert list((tmp_path / "run" / "logs").glob("rank*.error.txt"))
    exits = [r["exit"] for r in wandb_records(tmp_path / "run") if r["type"] == "exit"]
    assert [e.get("exit_code") for e in exits] == [1]  # the job still finished the W&B run, as failed
    assert_no_leftover_processes()


# ----------------------------------------------------------------------------- exchange
def test_exchange_choice_is_reported_and_prefetch_trains_the_same(default_run, runs):
    """On the DDP path (``dp=ddp``) exchange=auto (default) records its choice and timings in metrics, summary
    and W&B config; exchange=broadcast with prefetch=true ends with bitwise the same parameters (as the default
    job's, the engine's)."""
    ddp_auto = runs["ddp-auto"]
    auto = summary(ddp_auto)["exchange"]
    assert auto["requested"] == "auto"
    assert_auto_rule(auto, ("broadcast", "p2p_all_gather"))  # the in-place collectives, broadcast preferred
    rows = metrics(ddp_auto)
    assert [row.get("comm/exchange_mode") for row in rows] == [auto["mode"]] + [None] * (len(rows) - 1)
    assert all(row["comm/exchange_exposed_s/max"] <= row["time/exchange_s/max"] + 1e-9 for row in rows)
    configs = [r for r in wandb_records(ddp_auto) if "exchange_report" in json.dumps(r)]
    assert configs, "the W&B run's config lacks exchange_report"

    result = summary(runs["prefetch"])
    assert result["prefetch"] is True and result["exchange"]["mode"] == "per_shard_broadcast"
    assert result["param_checksum"] == summary(default_run)["param_checksum"] == summary(ddp_auto)["param_checksum"]
    assert 0 <= result["exchange_exposed_s"] <= result["exchange_time_s"] + 1e-9
    closing = (runs["prefetch"] / ".done").read_text()  # the run's stdout
    share = result["exchange_exposed_s"] / result["step_time_s"]
    assert f"parameter exchange: {share:.0%} of the step exposed (median " in closing, closing
    assert "ms in flight, prefetch hid the rest)" in closing
