"""``checkpoint_format=dcp`` (issues 28, 37): the app writes torch.distributed.checkpoint directories
with an integrity record, resumes them exactly — with another partitioner, into a plain optimizer,
and in a job Slurm requeued — refuses a broken or tampered one before any rank starts, in one
line, and a run stopped by a signal names its newest one in the command it prints to continue."""

from __future__ import annotations

import functools
import os
import pickle
import shlex
import shutil
import signal
from pathlib import Path

import pytest

from tests.e2e.runs import assert_close, child_env, run_once, summary, together, train, train_together
from tests.e2e.test_app_faults import FOREVER, start, wait_for
from zero_lab.app.record.checkpoint_finder import DCP_EXTRA
from zero_lab.app.record.closing import resume_hint
from zero_lab.dcp_record import RECORD, write_record

STEP = "step_00000002.dcp"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "test_dcp_checkpoints"
    args = ("logger=none", "optim=zero_adam", "steps=4", "checkpoint_every=2", "checkpoint_format=dcp")
    return run_once(base, "saved", *args)


def _copy(run: Path, to: Path) -> Path:
    """A copy of the run's step-2 checkpoint at ``to/step_00000002.dcp``."""
    return Path(shutil.copytree(run / "checkpoints" / STEP, to / STEP))


def test_dcp_checkpoints_resume_exactly_with_another_partitioner_and_into_plain_adam(saved, tmp_path):
    run = saved
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [STEP, "step_00000004.dcp"]
    assert {p.name for p in (checkpoints / STEP).iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp",
                                                               "zero_lab.json", RECORD}  # fmt: skip
    theirs = _copy(run, tmp_path / "theirs")
    (theirs / RECORD).unlink()  # as torch's dcp.save or an older zero_lab wrote it: no integrity record
    flat, plain = tmp_path / "flat", tmp_path / "plain"
    done = train_together(
        ("logger=none", "optim=zero_adam", "partitioner=flat", "steps=4", f"resume={checkpoints / STEP}",
         "checkpoint_every=1", "checkpoint_format=dcp", "keep_checkpoints=1", f"hydra.run.dir={flat}"),
        ("logger=none", "optim=adam", "steps=4", f"resume={theirs}", f"hydra.run.dir={plain}"),
    )  # fmt: skip
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-3000:] for d in done]
    assert "integrity record" not in done[0].stderr
    assert (
        f"zero_lab: note: checkpoint {theirs} has no integrity record ({RECORD}): it was written by another tool "
        "or an older zero_lab, or copied without it; its files are loaded unverified"
    ) in done[1].stderr.splitlines()
    original, resumed_flat, resumed_plain = summary(run), summary(flat), summary(plain)
    assert resumed_flat["start_step"] == resumed_plain["start_step"] == 2
    assert resumed_flat["losses"] == original["losses"]  # bit for bit, Flat partitioner after SortedGreedy
    assert resumed_flat["param_checksum"] == original["param_checksum"]
    assert_close(resumed_plain["losses"], original["losses"])
    assert sorted(p.name for p in (flat / "checkpoints").iterdir()) == ["step_00000004.dcp"]


class _Touch:
    """Unpickling this runs ``touch <marker>``: a ``.metadata`` someone replaced."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_broken_or_tampered_dcp_checkpoint_is_one_line_before_any_rank_starts(saved, tmp_path):
    """A tampered ``.metadata`` (its record rewritten too) runs nothing; a byte flipped mid-file
    and another model size are named — each one line, exit code 2, no rank started, no traceback."""
    run = saved
    marker = tmp_path / "ran"
    tampered = _copy(run, tmp_path / "tampered")
    (tampered / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))
    write_record(tampered)
    flipped = _copy(run, tmp_path / "flipped")
    data = bytearray((flipped / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (flipped / "__0_0.distcp").write_bytes(bytes(data))
    cases = {
        tampered: ((), f"checkpoint {tampered}: .metadata: refused the global {os.system.__module__}.system"),
        flipped: ((), f"checkpoint {flipped} is corrupt: __0_0.distcp has {len(data)} bytes (sha256 "),
        run / "checkpoints" / STEP: (("model.hidden=48",), f"checkpoint {run / 'checkpoints' / STEP}: .metadata: "
                                     "model.layers.0.weight has shape (512, 256) in the checkpoint, (48, 256) in "
                                     "this model"),
    }  # fmt: skip
    runs = {path: tmp_path / f"run{i}" for i, path in enumerate(cases)}
    done = train_together(
        *(("logger=none", "steps=4", *extra, f"resume={path}", f"hydra.run.dir={runs[path]}")
          for path, (extra, _) in cases.items())
    )  # fmt: skip
    for (path, (_, expected)), result in zip(cases.items(), done):
        assert result.returncode == 2, result.stderr[-3000:]
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"zero_lab: resume: {expected}"), line
        assert "Traceback" not in result.stdout + result.stderr
        assert not runs[path].exists()  # refused before Hydra made the run dir: no rank started
    assert not marker.exists()


def test_a_requeued_job_resumes_its_newest_dcp_checkpoint_and_refuses_a_broken_one_as_resume_does(saved, tmp_path):
    """A job Slurm requeued (``SLURM_RESTART_COUNT=1``, no ``resume=``) finds its run dir's newest DCP
    checkpoint and resumes it bit for bit; the same checkpoint with a byte flipped ends the job before
    any rank starts, in the one line ``resume=`` gets (the requeue path runs the same check)."""
    newest = "step_00000004.dcp"
    good, broken = tmp_path / "good", tmp_path / "broken"
    for run_dir in (good, broken):
        shutil.copytree(saved / "checkpoints", run_dir / "checkpoints")
    shard = broken / "checkpoints" / newest / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    args = ("logger=none", "optim=zero_adam", "steps=6", "checkpoint_every=2", "checkpoint_format=dcp")
    requeued = child_env() | {"SLURM_RESTART_COUNT": "1"}
    done = together(
        *(functools.partial(train, *args, f"hydra.run.dir={run_dir}", env=requeued) for run_dir in (good, broken))
    )
    assert done[0].returncode == 0, done[0].stderr[-3000:]
    resumed = summary(good)
    assert resumed["requeued"] == {"restarts": 1, "from_step": 4, "checkpoint": str(good / "checkpoints" / newest)}
    assert resumed["start_step"] == 4 and resumed["losses"][:4] == summary(saved)["losses"]
    assert done[1].returncode == 2, done[1].stderr[-3000:]
    (line,) = done[1].stderr.strip().splitlines()
    expected = f"checkpoint {broken / 'checkpoints' / newest} is corrupt: __0_0.distcp has {len(data)} bytes (sha256 "
    assert line.startswith(f"zero_lab: resume: {expected}"), line
    assert "Traceback" not in done[1].stdout + done[1].stderr
    assert not (broken / "metrics.jsonl").exists()  # no rank started


def test_a_dcp_run_stopped_by_sigterm_names_its_newest_checkpoint_and_the_resume_command(tmp_path):
    """SIGTERM once a ``checkpoint_format=dcp`` run wrote a checkpoint: the one line names the DCP
    checkpoint the stop saved (not "no complete checkpoint", as when only the native format was
    looked for) and the ``resume=<run dir>`` command, which resumes it (run with 2 more steps)."""
    run_dir = tmp_path / "stopped"
    args = (FOREVER, "checkpoint_every=2", "checkpoint_format=dcp")
    proc = start(run_dir, *args)
    wait_for(run_dir / "checkpoints" / STEP / DCP_EXTRA, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    done = len(summary(run_dir)["losses"])
    newest = run_dir / "checkpoints" / f"step_{done:08d}.dcp"
    assert (newest / DCP_EXTRA).is_file()
    command = shlex.join(["python", "train.py", "logger=none", *args, f"resume={run_dir}"])
    expected = f"zero_lab: stopped by SIGTERM after {done} steps; continue from step {done} ({newest}) with: {command}"
    assert expected in stderr.splitlines(), stderr[-3000:]
    overrides = [f"steps={done + 2}" if word == FOREVER else word for word in shlex.split(command)[2:]]
    resumed = train(*overrides, f"hydra.run.dir={tmp_path / 'resumed'}")  # the printed command, 2 steps more
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert summary(tmp_path / "resumed")["start_step"] == done


def test_the_resume_hint_names_the_newest_complete_dcp_checkpoint(saved, tmp_path):
    """On the files the app's DCP writer wrote: the newest (step 4); with step 4's record gone, as when
    it was cut short before its rename, step 2; with none left, that there is none."""
    meta = {"overrides": ["checkpoint_format=dcp", "hydra.run.dir=x"]}
    command = f"python train.py checkpoint_format=dcp resume={saved}"
    newest = saved / "checkpoints" / "step_00000004.dcp"
    assert resume_hint(saved, meta) == f"continue from step 4 ({newest}) with: {command}"
    run_dir = tmp_path / "run"
    shutil.copytree(saved / "checkpoints", run_dir / "checkpoints")
    (run_dir / "checkpoints" / "step_00000004.dcp" / DCP_EXTRA).unlink()
    step_2 = run_dir / "checkpoints" / STEP
    assert resume_hint(run_dir, meta).startswith(f"continue from step 2 ({step_2}) with: ")
    shutil.rmtree(step_2)
    assert resume_hint(run_dir, meta).startswith(f"no complete checkpoint in {run_dir / 'checkpoints'} to resume")


def test_keep_checkpoints_keeps_the_newest_of_either_format(saved, tmp_path):
    """A run dir holding the app's DCP checkpoints of steps 2 and 4, resumed in place in the native
    format with ``keep_checkpoints=2``: the two newest of any format stay (its own steps 6 and 8);
    each format pruning only its own kept the DCP ones forever."""
    run_dir = tmp_path / "run"
    shutil.copytree(saved / "checkpoints", run_dir / "checkpoints")
    args = ("logger=none", "optim=zero_adam", "steps=8", "checkpoint_every=2", "keep_checkpoints=2")
    done = train(*args, f"resume={run_dir}", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(run_dir)["start_step"] == 4
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000006", "step_00000008"]
