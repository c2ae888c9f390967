"""A real Slurm cluster on the test machine: munged, slurmctld and two slurmd "nodes".

Each node is a network namespace this module creates (``ip netns add``), the two joined by
a veth pair whose addresses exist only inside them; each daemon runs in its node's network
namespace with its own mount and UTS namespaces (``nsenter --net=... unshare --mount
--uts``), its hostname set to the node's name and a hosts file naming both nodes
bind-mounted over ``/etc/hosts`` — so ``n1`` and ``n2`` resolve, and reach each other, the
way two machines would. (``ip netns exec`` is not used: it remounts ``/sys`` and slurmd then
finds no ``/sys/fs/cgroup``.) slurmctld runs on ``n1``, which is also the login node:
:meth:`SlurmCluster.command` wraps a command so that it runs there (``sbatch``, ``srun``,
``python train.py -m hydra/launcher=slurm``), and jobs inherit that node's view.

Everything lives under one temp dir; ``SLURM_CONF`` points the daemons and clients at its
``slurm.conf``. munged is reached through its socket (a file), so it needs no namespace.
Bring-up waits until both nodes are idle (≈ 0.4 s). :meth:`SlurmCluster.stop` cancels the
jobs, stops each daemon by pid (SIGTERM, then SIGKILL after a short grace: slurmd can ignore
SIGTERM while it retries a dead controller), kills any process still carrying this
cluster's ``SLURM_CONF`` (a job's ranks, slurmstepd), by pid, and deletes the namespaces.

    with SlurmCluster.start(tmp_path) as cluster:
        cluster.run(["sinfo"])

Needs root and Debian's ``slurm-wlm`` and ``munge`` (22.05): :func:`missing` says what is absent.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODES = ("n1", "n2")
ADDRESSES = ("10.77.0.1", "10.77.0.2")
CPUS_PER_NODE = 8  # more than the 2 cores of a CI runner (SlurmdParameters=config_overrides), so jobs run side by side
MEMORY_MB_PER_NODE = 8192
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")
TOOLS = ("ip", "nsenter", "unshare", "mount")
LIMIT_CHECK_S = 30  # slurmctld's PERIODIC_TIMEOUT: how often it tests time limits (compiled in)
CRED_EXPIRE_S = 5  # also how long a requeued job waits before it may start again (default 120, least 5)
ENABLE = "install Slurm and MUNGE (as root: apt-get install -y slurm-wlm munge) and run the tests as root"


def missing() -> str | None:
    """Why a cluster cannot start here (a sentence saying how to enable it), or ``None``."""
    if os.geteuid() != 0:
        return f"the Slurm tests need root (network namespaces, bind mounts); {ENABLE}"
    absent = [b for b in (*BINARIES, *TOOLS) if shutil.which(b) is None]
    if absent:
        return f"{', '.join(absent)} not found; {ENABLE}"
    return None


def _slurm_conf(root: Path, socket: Path) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={addr} CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB_PER_NODE} State=UNKNOWN"
        for name, addr in zip(NODES, ADDRESSES)
    )
    return f"""\
ClusterName=zerolab
SlurmctldHost={NODES[0]}({ADDRESSES[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket},cred_expire={CRED_EXPIRE_S}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldDebug=debug2
KillWait=5
DefMemPerCPU=512
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=10
SlurmdTimeout=10
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


@dataclass
class SlurmCluster:
    """A running cluster; see the module docstring."""

    root: Path
    netns: tuple[str, str]
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def hosts(self) -> Path:
        return self.root / "hosts"

    @property
    def env(self) -> dict[str, str]:
        """The environment clients and jobs see: this cluster's ``SLURM_CONF``."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ start
    @classmethod
    def start(cls, root: Path, timeout_s: float = 20.0) -> SlurmCluster:
        """Create the namespaces, write the config, start every daemon, wait until both nodes are idle."""
        tag = f"zl{os.getpid()}"
        cluster = cls(root=root, netns=(f"{tag}-{NODES[0]}", f"{tag}-{NODES[1]}"))
        try:
            cluster._network(tag)
            cluster._files()
            cluster._daemons()
            cluster._wait_idle(timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _network(self, tag: str) -> None:
        a, b = self.netns
        veth = (f"{tag}a", f"{tag}b")
        for ns in self.netns:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", veth[0], "netns", a, "type", "veth", "peer", "name", veth[1], "netns", b)
        for ns, dev, addr in zip(self.netns, veth, ADDRESSES):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")

    def _files(self) -> None:
        for sub in ("state", "log", "munge", *(f"spool/{n}" for n in NODES)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o755)  # the socket's dir: munged refuses a socket others cannot reach
        keys = self.root / "munge-key"
        keys.mkdir(mode=0o700, exist_ok=True)
        subprocess.run(["mungekey", "--create", f"--keyfile={keys / 'munge.key'}"], check=True, timeout=10)
        self.conf.write_text(_slurm_conf(self.root, munge / "munge.socket"))
        names = "".join(f"{addr} {name}\n" for name, addr in zip(NODES, ADDRESSES))
        self.hosts.write_text(f"127.0.0.1 localhost\n{names}")

    def _daemons(self) -> None:
        logs = self.root / "log"
        keys = self.root / "munge-key"
        munge = self.root / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={munge / 'munge.socket'}",
                f"--key-file={keys / 'munge.key'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={logs / 'munged.log'}",
                f"--seed-file={keys / 'munged.seed'}",
            ],
        )
        self._wait_for(lambda: (munge / "munge.socket").exists(), 10, "munged's socket")
        self._spawn("slurmctld", self.command(["slurmctld", "-D"], node=0))
        for index, name in enumerate(NODES):
            self._spawn(f"slurmd-{name}", self.command(["slurmd", "-D", "-N", name], node=index))

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - lives as long as the daemon
        self.daemons[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def _wait_idle(self, timeout_s: float) -> None:
        def idle() -> bool:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.root / 'log'}")
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            return all(states.get(n) == "idle" for n in NODES)

        self._wait_for(idle, timeout_s, "both nodes idle")

    @staticmethod
    def _wait_for(ready: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm test cluster: no {what} after {timeout_s:g} s")
            time.sleep(0.05)

    # ------------------------------------------------------------------ use
    def command(self, argv: Sequence[str], node: int = 0) -> list[str]:
        """``argv`` wrapped to run on node ``node`` (0: n1, the controller and login node)."""
        script = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns[node]}",
            "unshare",
            "--mount",
            "--uts",
            "sh",
            "-c",
            script,
            "sh",
            str(self.hosts),
            NODES[node],
            *argv,
        ]

    def run(
        self, argv: Sequence[str], timeout: float = 60, cwd: Path | str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the login node and wait (output captured as text)."""
        return subprocess.run(
            self.command(argv),
            env={**(env or os.environ), "SLURM_CONF": str(self.conf)},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def jobs(self) -> list[str]:
        """The ids of the jobs Slurm still knows as pending or running."""
        out = self.run(["squeue", "-h", "-o", "%i"], timeout=10)
        return out.stdout.split()

    def wait_until_no_jobs(self, timeout_s: float = 30.0) -> list[str]:
        """Wait until Slurm knows no job (a finished one stays a moment as COMPLETING); returns what is left."""
        deadline = time.monotonic() + timeout_s
        while (left := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def next_time_limit_check(self, timeout_s: float = 40.0) -> float:
        """Seconds until slurmctld next tests time limits (every 30 s, logged at debug2): it
        sends a job's ``--signal=<sig>@<s>`` at the first test at which the job's end is less
        than ``s`` + 30 s away, so a test that knows when the next one comes knows when its
        job is signalled."""
        log = self.root / "log" / "slurmctld.log"
        deadline = time.monotonic() + timeout_s
        while True:
            stamps = [line[1:24] for line in _lines(log) if "Testing job time limits" in line]
            if stamps:
                last = datetime.datetime.fromisoformat(stamps[-1])
                ahead = (last - datetime.datetime.now()).total_seconds() % LIMIT_CHECK_S
                return ahead
            if time.monotonic() > deadline:
                raise TimeoutError(f"slurmctld logged no time-limit test in {timeout_s:g} s: {log}")
            time.sleep(0.5)

    # ------------------------------------------------------------------ stop
    def stop(self, grace_s: float = 2.0) -> None:
        """Cancel the jobs, stop every daemon by pid, kill what is left of jobs, delete the namespaces."""
        if self.daemons.get("slurmctld") is not None and self.daemons["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "--partition=debug"], timeout=10)
        order = [n for n in self.daemons if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.daemons.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in order:
            proc = self.daemons.get(name)
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._kill_leftovers()
        for ns in self.netns:
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _ip("netns", "delete", ns)

    def _kill_leftovers(self) -> None:
        """SIGKILL, by pid, every process whose environment names this cluster's slurm.conf."""
        needle = f"SLURM_CONF={self.conf}\0".encode()
        me = os.getpid()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == me:
                continue
            try:
                if needle in (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
