"""Helpers for end-to-end tests: run the real ``python train.py`` and read what it wrote.

Every subprocess carries a marker in its environment, so a test can prove no process it
started outlived it (:func:`assert_no_leftover_processes`). The default run and a small
sweep are made once per session, whichever xdist worker needs them first (:func:`runs_once`,
:func:`session_base`; fixtures in ``tests/e2e/conftest.py``), and read by several test modules.
Runs that do not depend on each other are made together, two at a time (:func:`together`): the
suite's time is mostly these subprocesses starting up. ``make test`` runs each test file on one
worker (``--dist loadfile``), so a module's own fixtures are made once too.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WANDB = str(Path(sys.executable).with_name("wandb"))
MARKER = f"ZERO_LAB_TEST_{uuid.uuid4().hex[:12]}"
T = TypeVar("T")
SUMMARY_KEYS = {"final_loss", "losses", "world_size", "steps", "param_checksum"}


#: DDP + Adam runs that several modules compare with, by name: each module asks for the one it needs in
#: its own :func:`runs_once` call with :func:`session_base` (so it is made together with the module's
#: runs, two at a time, by the first module that asks, and read by the others).
REFERENCES: dict[str, tuple[tuple[str, ...], bool]] = {
    # the engine (test_engine_app.py) and ZeRO-Adam split along DDP's buckets (test_ddp_bucket_app.py)
    "adam-ddp": (("steps=4", "logger=none", "optim=adam", "dp=ddp"), False),
    # clipped on every step: the engine (test_engine_resume.py), flat ZeRO-Adam on DDP (test_app_precision.py)
    "adam-clipped": (("steps=6", "logger=none", "optim=adam", "optim.max_grad_norm=0.05"), False),
}


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "RANK", "WORLD_SIZE")}
    env[MARKER] = "1"
    return env


def train(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python train.py *args`` from the repo root (``env``: the child's whole environment)."""
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_on_terminal(*args: str, timeout: float = 240) -> tuple[int, str, str]:
    """``python train.py *args`` with stderr on a pseudo-terminal, as in an interactive shell (the
    progress bar draws); returns the exit code, stdout and everything the terminal showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns: tqdm draws
    shown: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run(
            [sys.executable, "train.py", *args],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=follower,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
        )
    finally:
        os.close(follower)
        reader.join(timeout=10)
        os.close(leader)
    return done.returncode, done.stdout, b"".join(shown).decode(errors="replace")


def together(*calls: Callable[[], T], jobs: int = 2) -> list[T]:
    """Call every ``call``, ``jobs`` at a time; results in call order.

    For independent ``train.py`` runs: a job spends its first seconds (interpreter, torch and
    Hydra imports, the config check) on one core, so on a 2-core runner two jobs started
    together end well before two in a row (measured on a shared 2-core machine, so roughly:
    15 s instead of 24 s for two ``python train.py logger=none steps=2``)."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda call: call(), calls))


def train_together(*commands: Sequence[str]) -> list[subprocess.CompletedProcess[str]]:
    """``python train.py *command`` for every command, two at a time (:func:`together`)."""
    return together(*(functools.partial(train, *command) for command in commands))


def run_once(base: Path, name: str, *args: str, multirun: bool = False) -> Path:
    """Run ``train.py`` into ``base/app_runs/name`` once per session; later calls reuse the result."""
    return runs_once(base, {name: (args, multirun)})[name]


def runs_once(base: Path, runs: dict[str, tuple[Sequence[str], bool]]) -> dict[str, Path]:
    """:func:`run_once` for every ``name: (args, multirun)``, the ones not made yet together
    (:func:`train_together`); each must succeed. Returns the run (or sweep) dirs by name.

    Each name is made under an exclusive lock (``base/app_runs/.<name>.lock``), so with a ``base``
    that every xdist worker shares (:func:`session_base`) a run is made once per session, not once
    per worker: a worker that needs it meanwhile waits for it."""
    out = {name: base / "app_runs" / name for name in runs}
    (base / "app_runs").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as locks:
        for name in sorted(runs):  # one order for every worker: no deadlock
            handle = locks.enter_context(open(base / "app_runs" / f".{name}.lock", "w"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        todo = [name for name in runs if not (out[name] / ".done").exists()]
        commands = []
        for name in todo:
            args, multirun = runs[name]
            key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
            commands.append([*(["-m"] if multirun else []), *args, f"{key}={out[name]}"])
        for name, result in zip(todo, train_together(*commands)):
            assert result.returncode == 0, f"{name}: " + result.stdout[-2000:] + result.stderr[-4000:]
            (out[name] / ".done").write_text(result.stdout)
    return out


def session_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dir every xdist worker of this test session shares (the parent of the workers' own base
    temps), or the base temp without xdist: for runs made once per session (:func:`runs_once`)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def jobs(sweep_dir: Path) -> list[Path]:
    """A sweep's job dirs in job order."""
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: int(p.name))


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the run's offline ``.wandb`` transaction log, as JSON."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    out = subprocess.run([WANDB, "leet", "inspect", "--json", str(log)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def assert_no_leftover_processes() -> None:
    """No live process carries this session's marker (ranks, wandb-core, torchrun agents)."""
    mine = str(os.getpid())
    leftovers = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or proc.name == mine:
            continue
        try:
            if MARKER.encode() in (proc / "environ").read_bytes():
                leftovers.append((proc / "cmdline").read_bytes().replace(b"\0", b" ")[:120])
        except OSError:
            continue
    assert not leftovers, leftovers


def wait_until_no_leftover_processes(timeout: float = 15.0) -> None:
    """:func:`assert_no_leftover_processes`, allowing ``timeout`` seconds for processes that are
    ending (a killed job's ranks; a Slurm job whose result is written but whose steps still exit)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert_no_leftover_processes()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def assert_close(a: list[float], b: list[float], tol: float = 1e-6) -> None:
    assert len(a) == len(b)
    assert max(abs(x - y) for x, y in zip(a, b)) <= tol, (a, b)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, waiting for its parent to reap it, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
