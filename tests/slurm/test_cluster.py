"""The fixture itself: two nodes that resolve and reach each other, and jobs that span both."""

from __future__ import annotations

from tests.slurm.cluster import ADDRESSES, NODES, SlurmCluster


def test_one_step_runs_a_task_on_each_node_and_names_resolve_on_both(slurm: SlurmCluster):
    probe = 'echo "$SLURM_PROCID $(hostname) $(getent hosts n1 | cut -d" " -f1) $SLURMD_NODENAME"'
    out = slurm.run(["srun", "-N2", "-n2", "--label", "sh", "-c", probe], timeout=60)
    assert out.returncode == 0, out.stderr
    lines = sorted(line.split(": ", 1)[1] for line in out.stdout.splitlines())
    assert lines == [f"0 {NODES[0]} {ADDRESSES[0]} {NODES[0]}", f"1 {NODES[1]} {ADDRESSES[0]} {NODES[1]}"]
    assert slurm.wait_until_no_jobs() == []
