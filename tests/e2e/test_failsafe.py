"""Issue 20 end to end with the real ``python train.py``: a rank stopped with SIGSTOP is
named within the stall bound (``dist.stall_timeout_s``), with its state and its log."""

from __future__ import annotations

import os
import re
import subprocess
import time

from tests.e2e.runs import assert_no_leftover_processes, train_together
from tests.e2e.test_app_faults import FOREVER, start, wait_for
from tests.e2e.test_faults import rank_pid


def test_a_stopped_rank_is_named_within_the_stall_bound(tmp_path):
    run_dir = tmp_path / "stall"
    job = start(run_dir, FOREVER, "dist.stall_timeout_s=2")
    wait_for(run_dir / "metrics.jsonl", job)
    time.sleep(1.0)  # a few steps: the watch is armed once every rank has beaten
    victim = rank_pid(run_dir, 1)
    subprocess.run(["kill", "-STOP", str(victim)], check=True)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 1, stderr[-3000:]
    line = re.search(r"zero_lab: rank 1 stalled: (.*)", stderr)
    assert line, stderr[-3000:]
    assert re.match(r"no progress for \d+ s after \d+ step\(s\) \(bound: slowest step [\d.]+ s \+ stall timeout 2 s\)",
                    line.group(1)), line.group(1)  # fmt: skip
    assert line.group(1).endswith("its process is stopped (/proc state T: SIGSTOP or a debugger)")
    assert f"its log: {run_dir}/logs/rank1.log" in stderr
    assert "(rank 0: " in stderr  # the peer's state beside it, not blamed
    assert_no_leftover_processes()


def test_an_unusable_run_dir_is_one_line_naming_it_and_nothing_runs(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    under_a_file = tmp_path / "afile" / "run"
    read_only = tmp_path / "ro"
    read_only.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)], check=False)
    try:
        commands = [["logger=none", "steps=2", f"hydra.run.dir={under_a_file}"]]
        if mounted.returncode == 0:  # root: a read-only filesystem (chmod does not stop root)
            commands.append(["logger=none", "steps=2", f"hydra.run.dir={read_only / 'run'}"])
        results = train_together(*commands)
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(read_only)], check=False)
    expected = [f"zero_lab: run dir {under_a_file} cannot be used: Not a directory", "Read-only file system"]
    for result, fragment in zip(results, expected):
        assert result.returncode == 2, result.stderr[-3000:]
        assert fragment in result.stderr, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "Unable to configure handler" not in result.stderr
    assert_no_leftover_processes()


def test_configured_code_is_checked_before_it_runs_and_the_run_dir_is_always_claimed(tmp_path):
    """Issue 30's attacks through the real ``python train.py``: a ``--config-dir`` whose data is
    ``builtins.open``, whose logger is ``logging.basicConfig`` (both aimed at a victim file), whose
    experiment puts the run in ``/``. Each is one refusal before anything starts, the victim
    untouched. (The same check refuses the scheduler and ``optim.param_groups`` attacks:
    tests/unit/test_targets.py.)"""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    conf = tmp_path / "conf"
    for group, name, text in (
        ("data", "evil", f"_target_: builtins.open\nfile: {victim}\nmode: w\nglobal_batch: 32\n"),
        ("logger", "evil", f"_target_: logging.basicConfig\nforce: true\nfilemode: w\nfilename: {victim}\n"),
        ("experiment", "in_root", "# @package _global_\nhydra:\n  run:\n    dir: /\n"),
    ):
        (conf / group).mkdir(parents=True)
        (conf / group / f"{name}.yaml").write_text(text)
    root_before = set(os.listdir("/"))
    common = ["logger=none", "steps=2", "dist.world_size=1"]
    cases = {
        "data._target_=builtins.open: must be a class with shard(": ["--config-dir", str(conf), "data=evil", *common],
        "logger._target_=logging.basicConfig: must be a class with log, summary and close": [
            "--config-dir", str(conf), "logger=evil", "steps=2", "dist.world_size=1",
        ],
        "run dir / is a system directory": ["--config-dir", str(conf), "experiment=in_root", *common],
    }  # fmt: skip
    runs = [[*args, f"hydra.run.dir={tmp_path / f'run{i}'}"] if "experiment=in_root" not in args else args
            for i, args in enumerate(cases.values())]  # fmt: skip
    for (expected, _), result in zip(cases.items(), train_together(*runs)):
        assert result.returncode == 2, result.stderr[-3000:]
        assert f"zero_lab: {expected}" in result.stderr or f"  - {expected}" in result.stderr, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "raised" not in result.stderr, result.stderr[-3000:]
    assert victim.read_text() == "precious\n"
    assert set(os.listdir("/")) == root_before  # no .hydra/, train.log, logs/ or lock file in /
    assert not any((tmp_path / f"run{i}").exists() for i in range(len(cases)))  # nothing started: no run dir
    assert_no_leftover_processes()
