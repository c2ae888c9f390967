"""Ranks from Slurm's environment, without Slurm: host lists, ports, which processes are ranks."""

from __future__ import annotations

import pytest

from zero_lab.runtime import external
from zero_lab.runtime.slurm import PORT_BASE, PORT_SPAN, default_port, expand_hostlist, requeue_count, slurm_world

#: What srun sets for task 3 of `srun -N2 --ntasks-per-node=2` (measured on slurm 22.05).
STEP = {
    "SLURM_JOB_ID": "417",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NODELIST": "gpu[08-09]",
    "SLURM_JOB_NODELIST": "gpu[08-09]",
}


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("n[1-3,7],login", ["n1", "n2", "n3", "n7", "login"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,b[3],c-d[1-2]", ["a", "b3", "c-d1", "c-d2"]),
    ],
)
def test_expand_hostlist(hostlist, names):
    assert expand_hostlist(hostlist) == names


@pytest.mark.parametrize("bad", ["n[1-2", "n1-2]", "n[a-b]"])
def test_expand_hostlist_refuses_what_slurm_never_writes(bad):
    with pytest.raises(ValueError, match="Slurm host"):
        expand_hostlist(bad)


def test_a_step_of_several_tasks_is_a_world_rendezvousing_at_its_first_node():
    world = slurm_world(STEP)
    assert world is not None
    assert (world.rank, world.world_size, world.local_rank, world.master_addr) == (3, 4, 1, "gpu08")
    assert world.master_port == default_port("417", "0")
    assert PORT_BASE <= world.master_port < PORT_BASE + PORT_SPAN
    assert default_port("417", "1") != world.master_port  # the job's next step rendezvouses elsewhere
    assert slurm_world(STEP, port=29999).master_port == 29999  # dist.master_port wins


def test_a_batch_shell_or_a_step_of_one_task_is_not_a_world():
    batch_shell = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")}
    assert slurm_world(batch_shell) is None  # SLURM_NTASKS=4 but no step: the script's own shell
    assert slurm_world({**STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None  # spawns its ranks
    assert slurm_world({}) is None


def test_torchrun_wins_over_the_srun_that_started_it():
    torchrun = {**STEP, "TORCHELASTIC_RUN_ID": "x", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    world = external.detect(torchrun)
    assert world is not None and (world.runner, world.rank, world.world_size) == ("torchrun", 5, 8)
    srun = external.detect(STEP)
    assert srun is not None and srun.runner == "srun"
    assert srun.env == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu08",
        "MASTER_PORT": str(default_port("417", "0")),
    }


def test_requeue_count():
    assert requeue_count({}) == 0
    assert requeue_count({"SLURM_RESTART_COUNT": "2"}) == 2


class CountingRunner:
    """A runner of its own: ``FAKE_RANK``/``FAKE_SIZE`` mark its ranks; it counts its detections."""

    name = "fake"
    calls = 0

    def detect(self, environ, port):
        CountingRunner.calls += 1
        if "FAKE_RANK" not in environ:
            return None
        return external.ExternalWorld(self.name, int(environ["FAKE_RANK"]), int(environ["FAKE_SIZE"]), 0, {}, "job7")

    def world_size_fix(self, wanted):
        return f"start {wanted} fake ranks"


@pytest.fixture
def runners(monkeypatch):
    """The runner registry and the process's detected world, restored after the test."""
    monkeypatch.setattr(external, "_RUNNERS", dict(external._RUNNERS))
    monkeypatch.setattr(external, "_DETECTED", {})
    CountingRunner.calls = 0


def test_a_registered_runner_is_asked_first_and_named_in_its_world(runners):
    assert external.registered_runners() == ("torchrun", "srun")
    assert external.register_runner(CountingRunner) is CountingRunner
    external.register_runner(CountingRunner)  # again: a no-op
    assert external.registered_runners() == ("fake", "torchrun", "srun")
    world = external.detect({**STEP, "FAKE_RANK": "1", "FAKE_SIZE": "3"})
    assert (world.runner, world.rank, world.world_size, world.run_id) == ("fake", 1, 3, "job7")
    assert external.runner_named(world.runner).world_size_fix(4) == "start 4 fake ranks"
    assert external.detect(STEP).runner == "srun" and external.detect(STEP).run_id == "417"
    with pytest.raises(ValueError, match="no runner 'mpirun'; registered: \\['fake', 'torchrun', 'srun'\\]"):
        external.runner_named("mpirun")


def test_what_is_not_a_runner_or_takes_a_known_name_is_refused(runners):
    class Nameless:
        def detect(self, environ, port):
            return None

    class Torchrun2(CountingRunner):
        name = "torchrun"

    with pytest.raises(TypeError, match="Nameless is not an ExternalRunner: it needs name, detect"):
        external.register_runner(Nameless)
    with pytest.raises(ValueError, match="runner 'torchrun' is already Torchrun; give Torchrun2 another name"):
        external.register_runner(Torchrun2)
    assert external.registered_runners() == ("torchrun", "srun")


def test_this_process_s_world_is_detected_once(runners, monkeypatch):
    """``fail``, the run-dir callback and the job each ask; the environment is read once."""
    external.register_runner(CountingRunner)
    monkeypatch.setenv("FAKE_RANK", "2")
    monkeypatch.setenv("FAKE_SIZE", "4")
    assert (external.rank(), external.active(), external.detect().world_size) == (2, True, 4)
    assert CountingRunner.calls == 1
    monkeypatch.delenv("FAKE_RANK")  # a running rank's runner variables do not change; the answer is kept
    assert external.rank() == 2 and CountingRunner.calls == 1
    assert external.detect({}) is None and CountingRunner.calls == 2  # a given environment is always read
    assert external.detect(port=None).rank == 2 and CountingRunner.calls == 2
    assert external.detect(port=29999) is None and CountingRunner.calls == 3  # another rendezvous port: read again
