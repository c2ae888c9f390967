"""Per-rank progress beats, so the process that started a world can tell a stalled rank.

A world started by :func:`zero_lab.runtime.spawn.run_world` shares one small array of
doubles with its ranks: two slots per rank, ``[beats, time of the last beat]`` (the time
is ``time.monotonic()``, one clock for every process of the host). A rank calls
:func:`beat` after every training step and around long phases (a checkpoint save); the
parent watches the array (:class:`StallWatch`). Outside such a world (torchrun, a test,
a script) :func:`beat` does nothing.

    from zero_lab.runtime import heartbeat
    heartbeat.beat()   # in the training loop, once per step

What the parent can tell about a rank that stopped beating comes from ``/proc/<pid>``
(:func:`process_state`): its scheduler state (``T``: stopped, by SIGSTOP or a debugger;
``D``: in uninterruptible I/O; ``S``: sleeping) and the kernel function it sleeps in
(``wchan``). A rank sleeping in a futex or poll while a peer is stopped is most likely
waiting in a collective for that peer; the message says "most likely", because that is
all the kernel tells.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ProcessState", "StallWatch", "attach", "beat", "process_state"]

_slot: tuple[Any, int] | None = None


def attach(array: Any, rank: int) -> None:
    """In a rank: beat into ``array`` (a shared ``multiprocessing`` array) as ``rank``."""
    global _slot
    _slot = (array, rank)


def beat() -> None:
    """Record progress: one more beat, now (a no-op outside a :func:`run_world` world)."""
    if _slot is not None:
        array, rank = _slot
        array[2 * rank + 1] = time.monotonic()
        array[2 * rank] += 1


@dataclass(frozen=True)
class ProcessState:
    """What ``/proc/<pid>`` says about a rank's process (``state`` is ``"?"`` off Linux)."""

    state: str
    wchan: str

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    @property
    def in_io(self) -> bool:
        return self.state == "D"

    @property
    def waiting(self) -> bool:
        """Asleep in a futex or poll: what a rank blocked in a collective looks like."""
        return self.state == "S" and any(w in self.wchan for w in ("futex", "poll", "epoll", "select"))

    def describe(self) -> str:
        where = f" in {self.wchan}" if self.wchan else ""
        if self.stopped:
            return f"its process is stopped (/proc state {self.state}: SIGSTOP or a debugger)"
        if self.in_io:
            return f"its process is in uninterruptible I/O (/proc state D{where})"
        if self.waiting:
            return f"its process sleeps{where} (most likely in a collective, waiting for a peer)"
        if self.state == "R":
            return "its process is running (computing, or spinning) but not finishing a step"
        if self.state == "?":
            return "its process state is unknown (no /proc here)"
        return f"its process sleeps (/proc state {self.state}{where}; e.g. reading a file, a pipe or a socket)"


def process_state(pid: int) -> ProcessState:
    """The scheduler state and ``wchan`` of ``pid`` from ``/proc`` (``"?"`` where unreadable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ProcessState("?", "")
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        wchan = ""
    return ProcessState(state, "" if wchan == "0" else wchan)


@dataclass
class StallWatch:
    """In the parent: decide from the beats when a world has stalled.

    Armed once every rank has beaten (start-up, model building and a resume's load are
    not steps, and are bounded by the collective timeout instead). Then a rank is stalled
    when its last beat is older than ``timeout_s`` past the slowest interval between two
    beats seen so far on any rank (the slowest step): ``bound = slowest + timeout_s``.
    """

    array: Any
    world_size: int
    timeout_s: float
    slowest: float = 0.0
    _seen: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._seen = [(0.0, 0.0)] * self.world_size

    def beats(self, rank: int) -> int:
        return int(self.array[2 * rank])

    def bound(self) -> float:
        return self.slowest + self.timeout_s

    def stalled(self, done: set[int]) -> list[int]:
        """Ranks (not in ``done``) whose last beat is older than :meth:`bound`, oldest first."""
        now = time.monotonic()
        for rank in range(self.world_size):
            count, stamp = self.array[2 * rank], self.array[2 * rank + 1]
            seen_count, seen_stamp = self._seen[rank]
            if count > seen_count:
                if seen_count >= 1:
                    self.slowest = max(self.slowest, (stamp - seen_stamp) / (count - seen_count))
                self._seen[rank] = (count, stamp)
        active = [r for r in range(self.world_size) if r not in done]
        if not active or any(self._seen[r][0] < 1 for r in active):
            return []
        late = [r for r in active if now - self._seen[r][1] > self.bound()]
        return sorted(late, key=lambda r: self._seen[r][1])

    def since_last(self, rank: int) -> float:
        return time.monotonic() - self._seen[rank][1]
