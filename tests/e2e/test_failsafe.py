"""Issue 20 end to end with the real ``python train.py``: a rank stopped with SIGSTOP is
named within the stall bound (``dist.stall_timeout_s``), with its state and its log."""

from __future__ import annotations

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
