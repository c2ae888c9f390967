"""Two "nodes" on one host: network namespaces joined by a rate-limited veth pair (needs root).

Each node is a network namespace (``ip netns add``) holding one end of a veth pair, with an
address that exists only inside it and a large MTU (65,000 bytes: TCP/IP and Ethernet headers add
about 0.1 % to a bulk transfer). Both ends shape their egress with a token bucket (``tc qdisc
... tbf rate R``), so each direction of the link moves at most ``R`` bits per second — an
inter-node network ``R`` wide. Traffic between two processes of one node goes over that node's
loopback and is not limited: the node's own fast link. The kernel counts the bytes each end
sends (``/sys/class/net/<dev>/statistics/tx_bytes``, read inside the namespace), an account of
what crossed the link that owes nothing to the processes that sent it.

Processes started with :meth:`TwoNodes.popen` run in a node's namespace (``ip netns exec``) in
a session of their own; :meth:`TwoNodes.close` kills every process still in either namespace,
by pid, and deletes both namespaces (which deletes the veth pair) — also after an exception or a
Ctrl-C, when used as a context manager::

    with TwoNodes.create(rate_mbit=200) as nodes:
        before = nodes.tx_bytes(0)
        nodes.popen(1, ["python", "-m", "http.server", "--bind", nodes.address(1), "8000"])
        nodes.popen(0, ["curl", "-d", "@big.file", f"http://{nodes.address(1)}:8000"]).wait()
        nodes.tx_bytes(0) - before        # what node 0 sent node 1

:func:`unavailable` says why this host cannot (not root, no ``ip``/``tc``, no namespaces or tbf).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = ["ADDRESSES", "MTU", "TwoNodes", "unavailable"]

#: The two nodes' addresses (they exist only inside the namespaces, so they clash with nothing).
ADDRESSES = ("10.78.0.1", "10.78.0.2")
#: The veth's MTU: large, so that headers are a small share of the bytes counted.
MTU = 65000
_TIMEOUT_S = 10


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_TIMEOUT_S)
    if result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def _tc(namespace: str, *args: str) -> None:
    result = subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"tc {' '.join(args)} (in {namespace}): {result.stderr.strip() or result.returncode}")


def _burst_bytes(rate_mbit: float) -> int:
    """tbf's bucket: 10 ms at the rate, and at least two 64 KiB segments (GSO hands veth segments that large)."""
    return max(int(rate_mbit * 1e6 / 8 * 0.010), 2 * 65536 + 2 * MTU)


@dataclass
class TwoNodes:
    """Two namespaces and the veth between them; see the module docstring."""

    namespaces: tuple[str, str]
    devices: tuple[str, str]
    rate_mbit: float
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def create(cls, rate_mbit: float, tag: str | None = None) -> TwoNodes:
        """Both namespaces, the veth pair (MTU :data:`MTU`) and a tbf of ``rate_mbit`` on each end.

        ``tag`` (default ``zl<pid>``, ≤ 9 characters) names them: ``<tag>-n0``, ``<tag>-n1`` and the
        devices ``<tag>a``, ``<tag>b``. Whatever was made is deleted again if a step fails."""
        tag = tag or f"zl{os.getpid()}"
        nodes = cls((f"{tag}-n0", f"{tag}-n1"), (f"{tag}a", f"{tag}b"), rate_mbit)
        try:
            nodes._build()
        except BaseException:
            nodes.close()
            raise
        return nodes

    def _build(self) -> None:
        for namespace in self.namespaces:
            _ip("netns", "add", namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        a, b = self.namespaces
        _ip("link", "add", self.devices[0], "netns", a, "type", "veth", "peer", "name", self.devices[1], "netns", b)
        burst = _burst_bytes(self.rate_mbit)
        for namespace, device, address in zip(self.namespaces, self.devices, ADDRESSES):
            _ip("-n", namespace, "link", "set", device, "mtu", str(MTU))
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            _ip("-n", namespace, "link", "set", device, "up")
            rate = f"{self.rate_mbit:g}mbit"
            _tc(
                namespace,
                "qdisc",
                "add",
                "dev",
                device,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                str(burst),
                "latency",
                "1s",
            )

    def address(self, node: int) -> str:
        return ADDRESSES[node]

    def tx_bytes(self, node: int) -> int:
        """Bytes node ``node``'s end of the veth has sent since it was made (the kernel's count)."""
        path = f"/sys/class/net/{self.devices[node]}/statistics/tx_bytes"
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespaces[node], "cat", path],
            capture_output=True,
            text=True,
            check=True,
            timeout=_TIMEOUT_S,
        )
        return int(out.stdout)

    def crossed(self) -> tuple[int, int]:
        """``(node 0 → node 1, node 1 → node 0)`` bytes so far."""
        return self.tx_bytes(0), self.tx_bytes(1)

    def popen(
        self,
        node: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stdout: int | None = subprocess.PIPE,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside node ``node``'s namespace, in a session of its own; :meth:`close` ends it."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[node], *argv],
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._processes.append(process)
        return process

    def _pids(self) -> list[int]:
        pids: list[int] = []
        for namespace in self.namespaces:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                pids += [int(p) for p in _ip("netns", "pids", namespace).split()]
        return pids

    def _kill_all(self, grace_s: float = 3.0) -> None:
        """SIGTERM every process in the namespaces (and the ones this object started), SIGKILL what is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = set(self._pids()) | {p.pid for p in self._processes if p.poll() is None}
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and (self._pids() or any(p.poll() is None for p in self._processes)):
                time.sleep(0.05)
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)

    def close(self) -> None:
        """End every process in both nodes and delete the namespaces (the veth goes with them)."""
        self._kill_all()
        existing = set(_ip("netns", "list").split())
        for namespace in self.namespaces:
            if namespace in existing:
                _ip("netns", "delete", namespace)

    def __enter__(self) -> TwoNodes:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def unavailable() -> str | None:
    """Why two nodes cannot be made here (one line saying what is missing), or ``None``."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, tc)"
    absent = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if absent:
        return f"{' and '.join(absent)} not found (iproute2)"
    try:
        TwoNodes.create(rate_mbit=100, tag=f"zq{os.getpid() % 100000}").close()
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        return f"cannot make two rate-limited namespaces here: {str(error).splitlines()[0]}"
    return None
