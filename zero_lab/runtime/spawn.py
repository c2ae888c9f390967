"""Start a world of ranks from inside one process (a Hydra job, a test, a script).

:func:`run_world` starts ``world_size`` processes running ``fn(*args)`` with a
``torch.distributed`` process group already initialised, and returns their results in
rank order. The rendezvous is a ``TCPStore`` the *parent* hosts on a port the OS
picks, so concurrent worlds (a joblib sweep, parallel tests) never collide on a port.

Failure is bounded: if a rank raises or dies, the others are killed at once and
:class:`RankFailure` names the rank and carries its traceback — the rank that failed
first: a rank that died without reporting (SIGKILL, a segfault) outranks its peers'
"Connection reset by peer" errors, which only echo its death. Every collective inside
the ranks times out after ``timeout_s`` (a hung peer becomes an error on the waiting
rank, so a failure); with ``deadline_s`` the whole world is also killed, and
:class:`TimeoutError` raised, once it has run that long. Each rank ends with
``destroy_process_group()``, a flush and ``os._exit`` — ranks that returned through
the interpreter's normal shutdown sometimes crashed after their work was done.

Stalls: with ``stall_timeout_s``, every rank beats (:func:`zero_lab.runtime.heartbeat.beat`,
once per training step) into an array shared with this process, which stops the world
when a rank has not beaten for ``stall_timeout_s`` past the slowest step seen so far
(armed once every rank has beaten once) and raises :class:`RankStalled` naming that
rank: the one ``/proc`` shows stopped (SIGSTOP, a debugger) or in uninterruptible I/O, else
one not asleep the way a rank waiting in a collective is, else the one with the fewest
beats (while a stop signal is being handled, ``stop_grace_s`` bounds the world instead).
When a collective times out first (the last resort), a rank that is still alive and never
reported is blamed, not the peer that waited for it.
An error may name the rank whose fault it reports (``error.blames_rank``: every rank stops
on a NaN loss, but the rank that produced it is the cause): a rank so named that failed too
is blamed before its peers.
A failure's one-line ``summary`` is its exception's own message (first line; a Hydra
``InstantiationException`` is unwrapped to the error it wraps), not a traceback's last line.

Signals: while the world runs, the first SIGTERM or SIGINT the parent receives is
forwarded to every rank as SIGTERM, SIGUSR2 (Slurm's time-limit warning) as SIGUSR2 (a rank
that handles it — the app's loop does, see
:mod:`zero_lab.runtime.signals` — finishes its step, checkpoints and returns normally), and
the ranks get ``stop_grace_s`` to finish; a second signal, a rank dying after the
signal or the grace running out kills them at once and raises :class:`Interrupted`.
On Linux every rank also dies with its parent (``PR_SET_PDEATHSIG``), so even a
``kill -9`` of the parent leaves no rank running.

    results = run_world(train_one_rank, world_size=2, args=(cfg,))
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing import forkserver
from typing import Any

import torch
import torch.distributed as dist

from zero_lab.comm import set_group_timeout
from zero_lab.runtime import heartbeat
from zero_lab.runtime.heartbeat import StallWatch, process_state
from zero_lab.runtime.signals import STOP_SIGNALS, blocked_for_children, handling_stop_signals, signal_name
from zero_lab.runtime.startup_output import held_stderr

__all__ = [
    "Interrupted",
    "RankFailure",
    "RankStalled",
    "blamed_rank",
    "cause_line",
    "describe_exit",
    "last_line",
    "run_world",
    "start_forkserver",
]

_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "zero_lab"]


class RankFailure(RuntimeError):
    """A rank raised or died; ``rank`` says which, ``details`` holds its traceback.

    ``exitcode`` is set when the rank died without reporting (negative: killed by that
    signal). ``others`` holds the failures of other ranks seen in the same moment (often
    only the echo of this one: a peer's connection reset).
    """

    def __init__(
        self,
        rank: int,
        details: str,
        others: dict[int, str] | None = None,
        exitcode: int | None = None,
        summary: str | None = None,
    ):
        self.rank = rank
        self.details = details
        self.exitcode = exitcode
        self.others = others or {}
        self.summary = summary or last_line(details)  # the error's own message, first line
        also = "".join(f"\n(rank {r} failed too: {last_line(d)})" for r, d in sorted(self.others.items()))
        super().__init__(f"rank {rank} failed:\n{details}{also}")


class RankStalled(RankFailure):
    """A rank made no progress within the stall bound, or never arrived at a collective that
    timed out on its peers; ``summary`` says what ``/proc`` showed of it."""


class Interrupted(RuntimeError):
    """A SIGTERM/SIGINT ended the world without a clean stop: a second signal came, or a
    rank died of the first (e.g. one that does not handle it, or still starting up)."""

    def __init__(self, signum: int, why: str):
        self.signum = signum
        super().__init__(f"stopped by {signal_name(signum)}: {why}")


# Errors that only echo a peer's death or absence (a collective's timeout: the peer never came).
_ECHOES = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Timed out waiting",
    "Socket Timeout",
)


def cause_line(error: BaseException) -> str:
    """``"RuntimeError: <first line of its message>"``: the exception's own words, once
    unwrapped from Hydra's ``InstantiationException`` (whose last line is only ``full_key: …``)."""
    while type(error).__name__ == "InstantiationException" and error.__cause__ is not None:
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def last_line(details: str) -> str:
    """The last non-blank line of a traceback (the error itself), or ``"no details"``."""
    lines = [line for line in details.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no details"


def describe_exit(exitcode: int) -> str:
    """``-9`` -> ``"killed by SIGKILL (exit code -9)"``; ``3`` -> ``"exit code 3"``."""
    return f"killed by {signal_name(-exitcode)} (exit code {exitcode})" if exitcode < 0 else f"exit code {exitcode}"


def blamed_rank(error: BaseException) -> int | None:
    """The rank ``error`` says caused it (its ``blames_rank`` attribute), else ``None``."""
    rank = getattr(error, "blames_rank", None)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _is_echo(details: str) -> bool:
    return any(echo in details for echo in _ECHOES)


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    backend: str,
    port: int,
    timeout_s: float,
    args: Sequence[Any],
    results: Any,
    threads: int,
    beats: Any,
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    _release_forkserver()
    _die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM,))  # blocked only to keep a forkserver alive
    heartbeat.attach(beats, rank)
    torch.set_num_threads(threads)
    code = 0
    try:
        timeout = timedelta(seconds=timeout_s)
        with held_stderr():  # Gloo's retries when a peer ends while the world starts: not the terminal's
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        set_group_timeout(timeout)
        payload = (rank, True, pickle.dumps(fn(*args)))
    except BaseException as error:
        payload = (rank, False, (traceback.format_exc(), cause_line(error), blamed_rank(error)))
        code = 1
    try:
        results.put(payload)
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # the world may already be broken
                dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _release_forkserver() -> None:
    """In a rank forked from a forkserver: close this rank's copy of the server's "alive" pipe.

    multiprocessing hands every forked child the pipe's write end, and the server runs until
    every holder is gone; ranks that held it would keep their parent, the server, alive after
    the job's process died, and so never get their ``PR_SET_PDEATHSIG``. Without it the server
    ends with the job's process, and its ranks with the server."""
    fd = forkserver._forkserver._forkserver_alive_fd
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        forkserver._forkserver._forkserver_alive_fd = None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphaned ranks)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


class _ForwardSignals:
    """In the parent, while a world runs: forward the first SIGTERM/SIGINT to the ranks as
    SIGTERM and give them ``grace_s`` to stop; a second signal raises :class:`Interrupted`.
    ``deadline`` is when the grace period ends (``inf`` before a signal).

        with handling_stop_signals(forwarding.handle): ...
    """

    def __init__(self, procs: list[Any], grace_s: float):
        self.procs = procs
        self.grace_s = grace_s
        self.signum = 0
        self.deadline = float("inf")

    def handle(self, signum: int, _frame: Any) -> None:
        if self.signum:
            raise Interrupted(signum, f"{signal_name(signum)} came twice, the ranks were killed mid-step")
        self.signum = signum
        self.deadline = time.monotonic() + self.grace_s
        forwarded = signal.SIGUSR2 if signum == signal.SIGUSR2 else signal.SIGTERM  # a time limit stays one
        for proc in self.procs:
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, forwarded)


def _context(start_method: str):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        start_forkserver()
    return ctx


#: Signals the forkserver starts with blocked, so every rank forked from it does too (the mask
#: survives fork): SIGUSR2 as in :func:`~zero_lab.runtime.signals.blocked_for_children`, and
#: SIGTERM, which Slurm's ``scancel`` and a process-group kill send to every process: the
#: forkserver must not die of it (its ranks would then die of ``PR_SET_PDEATHSIG`` mid-step,
#: unsaved; a rank unblocks it as it starts, so the SIGTERM the job forwards ends a rank that has
#: not reached its loop); and SIGINT, which a
#: Ctrl-C sends to the whole process group: the server would print a ``KeyboardInterrupt``
#: traceback while it imports, and a rank waits with it until its loop records it (the job
#: process forwards SIGTERM to the ranks).
_FORKSERVER_BLOCKS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def start_forkserver(*modules: str) -> None:
    """Start the forkserver that ranks are forked from, now, without waiting for it.

    The server is a fresh interpreter that imports :data:`_PRELOAD` and ``modules`` once; each
    rank started later (``start_method="forkserver"``) is a fork of it, so W ranks cost one
    import of torch and the app instead of W, and a job that calls this before its config check
    has the imports done on another core meanwhile. The same server serves every later world of
    this process (a sweep's jobs). It starts with :data:`_FORKSERVER_BLOCKS` blocked and ends with
    this process: at exit it is stopped and waited for (it also ends by itself when this process
    dies, and its ranks with it). Modules named after the server started are not imported by it.
    A no-op when it already runs."""
    _extra_preload.extend(m for m in modules if m not in _extra_preload)
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        return
    forkserver.set_forkserver_preload(_PRELOAD + [m for m in _extra_preload if m not in _PRELOAD])
    with blocked_for_children(_FORKSERVER_BLOCKS):
        forkserver.ensure_running()
    atexit.register(_stop_forkserver)


def _stop_forkserver() -> None:
    """At exit: end the forkserver at once and reap it. It holds no state (its ranks have ended),
    and its orderly shutdown — an interpreter with torch loaded — took 1.3 s of every job's exit."""
    server = forkserver._forkserver
    if server._forkserver_pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(server._forkserver_pid, signal.SIGKILL)
    server._stop()  # closes our end of its alive pipe, waits for it, removes its socket


_extra_preload: list[str] = []


def preload(*modules: str) -> None:
    """Modules a forkserver should import once for all worlds (call before the first world)."""
    _extra_preload.extend(m for m in modules if m not in _extra_preload)


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    start_method: str = "spawn",
    threads_per_rank: int = 1,
    stop_grace_s: float = 120.0,
    deadline_s: float | None = None,
    stall_timeout_s: float | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` fresh ranks; return the results by rank.

    ``timeout_s`` bounds every collective; ``deadline_s`` (``None``: no limit) the whole
    world; ``stop_grace_s`` how long the ranks may take to stop after SIGTERM/SIGINT;
    ``stall_timeout_s`` (``None``: off) how long past the slowest step seen a rank may go
    without a heartbeat before the world is stopped (:class:`RankStalled`).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    procs: list[Any] = []
    forwarding = _ForwardSignals(procs, stop_grace_s)
    with handling_stop_signals(forwarding.handle):  # from before anything is made: nothing leaks, nothing is orphaned
        ctx = _context(start_method)
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        results = ctx.SimpleQueue()
        beats = ctx.Array("d", 2 * world_size, lock=False)  # per rank: [beats, monotonic time of the last]
        procs.extend(
            ctx.Process(
                target=_rank_main,
                args=(fn, rank, world_size, backend, store.port, timeout_s, args, results, threads_per_rank, beats),
                daemon=True,
                name=f"zero_lab-rank{rank}",
            )
            for rank in range(world_size)
        )
        try:
            if forwarding.signum:
                raise Interrupted(forwarding.signum, "no rank was started")
            # a stop signal while the ranks start waits, then goes to every rank started (and a
            # SIGUSR2 or SIGINT waits in each rank for its loop: signals.py)
            with blocked_for_children(STOP_SIGNALS):
                for proc in procs:
                    proc.start()
            deadline = float("inf") if deadline_s is None else time.monotonic() + deadline_s
            watch = None if stall_timeout_s is None else StallWatch(beats, world_size, stall_timeout_s)
            return _collect(procs, results, deadline, forwarding, watch, beats)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
            for proc in procs:
                if proc.pid is not None:
                    proc.join(timeout=10)
            del store


def _collect(
    procs: list[Any],
    results: Any,
    deadline: float,
    forwarding: _ForwardSignals,
    watch: StallWatch | None = None,
    beats: Any = None,
) -> list[Any]:
    """Wait for one result per rank; fail fast on the first error, death or stall."""
    reports = _Reports(procs, results)
    while len(reports.out) < len(procs):
        reports.drain()
        reports.note_deaths()
        if watch is not None and not reports.failures and not forwarding.signum and watch.stalled(set(reports.out)):
            raise _stalled(procs, watch, reports.out)
        if reports.failures:
            reports.gather_more_failures()
            cause = reports.root_cause()
            if _is_echo(cause.details) and (absent := reports.absent()):
                cause = _absent_from_collective(procs, absent, cause)
            if forwarding.signum:
                raise Interrupted(forwarding.signum, _unclean_stop(cause, beats)) from cause
            raise cause
        if time.monotonic() > min(deadline, forwarding.deadline):
            missing = sorted(set(range(len(procs))) - set(reports.out))
            if time.monotonic() > forwarding.deadline:
                why = f"ranks {missing} did not stop within {forwarding.grace_s:g} s; the world was killed"
                raise Interrupted(forwarding.signum, why)
            raise TimeoutError(f"ranks {missing} did not finish in time; the world was stopped")
        time.sleep(0.005)
    return [reports.out[rank] for rank in range(len(procs))]


def _unclean_stop(cause: RankFailure, beats: Any) -> str:
    """Why a stop signal ended the world uncleanly: the ranks were still starting (no rank had
    beaten: :mod:`~zero_lab.runtime.heartbeat`, once per step), or a rank did not stop cleanly."""
    if beats is not None and not any(beats[2 * rank] for rank in range(len(beats) // 2)):
        return "the ranks were stopped while starting, before any step"
    return f"rank {cause.rank} ended without stopping cleanly"


class _Reports:
    """What the ranks of one world have reported so far: ``out`` (rank -> result),
    ``failures`` (rank -> traceback, or how its process ended), ``summaries`` (rank -> its
    error's own first line) and ``died`` (rank -> exit code of a rank that ended without a
    report, in the order seen)."""

    def __init__(self, procs: list[Any], results: Any) -> None:
        self.procs = procs
        self.results = results
        self.out: dict[int, Any] = {}
        self.failures: dict[int, str] = {}
        self.summaries: dict[int, str] = {}
        self.blames: dict[int, int | None] = {}  # rank -> the rank its error names as the cause
        self.died: dict[int, int] = {}

    def drain(self) -> None:
        """Take every report waiting in the queue."""
        while not self.results.empty():
            rank, ok, payload = self.results.get()
            if ok:
                self.out[rank] = pickle.loads(payload)
            else:
                self.failures[rank], self.summaries[rank], self.blames[rank] = payload

    def note_deaths(self) -> None:
        """Record ranks whose process ended without a report (killed, crashed), in the order seen."""
        for rank, proc in enumerate(self.procs):
            if rank in self.out or rank in self.failures or proc.exitcode is None:
                continue
            time.sleep(0.05)  # its report may still be in flight
            self.drain()
            if rank not in self.out and rank not in self.failures:
                self.died[rank] = proc.exitcode
                self.failures[rank] = f"process {describe_exit(proc.exitcode)} before reporting"

    def gather_more_failures(self) -> None:
        """Give the other ranks a moment to report or die: the first report may be an echo of a
        rank whose death is not noticed yet."""
        grace = time.monotonic() + 2.0
        while time.monotonic() < grace and len(self.failures) + len(self.out) < len(self.procs):
            self.drain()
            self.note_deaths()
            if all(p.exitcode is not None for p in self.procs) and self.results.empty():
                break
            time.sleep(0.02)

    def absent(self) -> list[int]:
        """Ranks still alive that neither returned nor reported a failure."""
        return [
            r for r, p in enumerate(self.procs) if r not in self.out and r not in self.failures and p.exitcode is None
        ]

    def root_cause(self) -> RankFailure:
        """The rank that failed first. Ranks that died without reporting come first — a SIGKILL
        or a segfault is a cause, never an echo — then ranks that a failure names as its cause
        (``blames_rank``: the rank whose loss was NaN), then ranks' own errors, then peers'
        collective errors that only echo a lost connection (Gloo's "Connection reset by peer");
        ties by rank."""
        order = list(self.died)
        blamed = {rank for rank in self.blames.values() if rank is not None and rank in self.failures}

        def key(rank: int) -> tuple[int, int]:
            if rank in self.died:
                return (0, order.index(rank))
            return (1 + (rank not in blamed) + _is_echo(self.failures[rank]), rank)

        ranked = sorted(self.failures, key=key)
        first = ranked[0]
        others = {r: self.failures[r] for r in ranked[1:]}
        return RankFailure(first, self.failures[first], others, self.died.get(first), self.summaries.get(first))


def _stalled(procs: list[Any], watch: StallWatch, out: dict[int, Any]) -> RankStalled:
    """The rank to blame for a stall: stopped, else in uninterruptible I/O, else one that is
    not asleep the way a rank waiting in a collective is (a pipe, a file, a busy loop), else
    the fewest beats (it is behind its peers), else the oldest last beat; every rank's state
    beside it."""
    active = [r for r in range(len(procs)) if r not in out]
    states = {r: process_state(procs[r].pid) for r in active}

    def key(rank: int) -> tuple[bool, bool, bool, int, float]:
        state = states[rank]
        return (not state.stopped, not state.in_io, state.waiting, watch.beats(rank), -watch.since_last(rank))

    rank = min(active, key=key)
    summary = (
        f"stalled: no progress for {watch.since_last(rank):.0f} s after {watch.beats(rank)} step(s) "
        f"(bound: slowest step {watch.slowest:.1f} s + stall timeout {watch.timeout_s:g} s); "
        f"{states[rank].describe()}"
    )
    others = {r: f"{watch.beats(r)} step(s); {states[r].describe()}" for r in active if r != rank}
    return RankStalled(rank, summary, others, summary=summary)


def _absent_from_collective(procs: list[Any], absent: list[int], waited: RankFailure) -> RankStalled:
    """A collective timed out (or lost its peer) on ``waited.rank`` while ``absent`` ranks
    live on without a report: blame the first of them, not the rank that waited."""
    rank = absent[0]
    state = process_state(procs[rank].pid)
    summary = (
        f"did not arrive at a collective: rank {waited.rank} gave up waiting ({waited.summary[:160]}); "
        f"{state.describe()}"
    )
    others = {waited.rank: waited.details} | waited.others
    return RankStalled(rank, summary, others, summary=summary)
