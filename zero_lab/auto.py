"""``auto``: one tuner that chooses a phase's strategy by timing its registered candidates.

It serves the parameter exchange (``exchange="auto"``, :mod:`zero_lab.exchange`) and the
gradient reduction (``grad_reduce="auto"``, :mod:`zero_lab.grad_reduce`). The phase hands
:func:`tune` its candidates in its *preference order* (fixed and documented by the phase: the
exchange's is registration order, broadcast first; the gradient phase's is fewest bytes sent,
then registration order) and ``trial(name)``, which runs candidate ``name`` once and returns
when it is done. The tuner allocates nothing itself; what a trial touches is the phase's
business (the exchange times its real buffers in place, :meth:`~zero_lab.exchange.ParamExchange.start`).

Algorithm, :func:`tune`:

1. **Once per question.** ``key`` names everything the answer depends on (phase, the group's
   ranks and backend, dtype, device, candidates, sizes). A decision is remembered per process
   under it; a later ``auto`` with the same key takes it without a trial.
2. **Timed.** :data:`TUNE_WARMUPS` untimed rounds of every candidate (a collective's first uses
   pay its setup), then :data:`TUNE_REPS` timed rounds, the candidates in a rotated order each
   round, so a drift of the machine's load does not always favour the same one.
3. **Time and noise, per candidate.** Its time is the median of its repetitions; its noise is
   half the spread between its slowest and fastest. One all-reduce MAX over the group makes
   the slowest rank's figures everyone's, so every rank decides the same.
4. **The rule** (:func:`decide`). Candidate ``c`` is *within the noise* of the fastest ``f``
   when ``time_c - time_f <= max(noise_c + noise_f, AUTO_MARGIN * time_f)``: the trial's own
   spread, floored at :data:`AUTO_MARGIN` (10 %) because two fresh processes disagree by more
   than one trial's spread. The choice is the first candidate, in preference order, within the
   noise of the fastest. So near-equal candidates always resolve to the preferred one (the same
   config gives the same choice), and only a candidate clearly faster than it displaces it.
   :attr:`Decision.within_noise` lists the other candidates within the noise of the choice,
   which the phase's report carries, so a summary says when the choice was a near-tie.

    decision = tune(key, comm, ["broadcast", "p2p_all_gather"], trial)
    decision.choice, decision.within_noise   # "broadcast", ("p2p_all_gather",)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator

__all__ = ["AUTO_MARGIN", "TUNE_REPS", "TUNE_WARMUPS", "Decision", "decide", "decided", "remember", "tune"]

#: The least relative gap between two candidates' times that counts as "clearly faster".
AUTO_MARGIN = 0.10
#: Timed repetitions of every candidate (the median is its time).
TUNE_REPS = 5
#: Untimed rounds of every candidate before the timed ones.
TUNE_WARMUPS = 1


@dataclass(frozen=True)
class Decision:
    """An ``auto`` choice and what it was made from (seconds, max over the group's ranks).

    ``timings_s``: each candidate's median time; ``noise_s``: half its spread; ``within_noise``:
    the other candidates indistinguishable from the choice; ``sample_bytes``: the bytes one
    trial of a candidate moved."""

    choice: str
    timings_s: dict[str, float] = field(default_factory=dict)
    noise_s: dict[str, float] = field(default_factory=dict)
    within_noise: tuple[str, ...] = ()
    sample_bytes: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "timings_s": dict(self.timings_s),
            "noise_s": dict(self.noise_s),
            "within_noise": list(self.within_noise),
            "tune_sample_bytes": self.sample_bytes,
        }


def decide(
    timings: Mapping[str, float], noise: Mapping[str, float] | None = None, margin: float = AUTO_MARGIN
) -> tuple[str, tuple[str, ...]]:
    """``(choice, the other candidates within the noise of it)`` from each candidate's time and
    noise; ``timings`` is in preference order (see the module docstring, step 4)."""
    if not timings:
        raise ValueError("auto: no candidate to choose from (register one)")
    noise = noise or {}

    def alike(a: str, b: str) -> bool:
        band = max(noise.get(a, 0.0) + noise.get(b, 0.0), margin * min(timings[a], timings[b]))
        return abs(timings[a] - timings[b]) <= band

    fastest = min(timings, key=timings.__getitem__)
    choice = next(name for name in timings if alike(name, fastest))
    return choice, tuple(name for name in timings if name != choice and alike(name, choice))


# key -> decision, for this process
_DECISIONS: dict[tuple[Hashable, ...], Decision] = {}


def decided(key: tuple[Hashable, ...]) -> Decision | None:
    """The decision this process took earlier under ``key``, if any."""
    return _DECISIONS.get(key)


def remember(key: tuple[Hashable, ...], decision: Decision) -> None:
    """Keep ``decision`` for later ``auto``\\ s with the same ``key`` (every rank of a group keeps the
    same: the figures are agreed by an all-reduce and every rank decides the same keys in order)."""
    _DECISIONS[key] = decision


def tune(
    key: tuple[Hashable, ...],
    comm: Communicator,
    candidates: Sequence[str],
    trial: Callable[[str], None],
    *,
    device: torch.device,
    sample_bytes: int,
    label: str,
) -> Decision:
    """Time ``trial`` of every candidate (preference order) and decide; see the module docstring.

    Collective: every rank of ``comm`` calls it with the same arguments. ``label`` names the
    all-reduce that agrees the figures; ``sample_bytes`` is reported as what one trial moved."""
    earlier = decided(key)
    if earlier is not None:
        return earlier

    def timed(name: str) -> float:
        start = time.perf_counter()
        trial(name)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for _ in range(TUNE_WARMUPS):
        for name in candidates:
            timed(name)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for rep in range(TUNE_REPS):
        shift = rep % len(candidates)
        for name in [*candidates[shift:], *candidates[:shift]]:
            samples[name].append(timed(name))
    mine = [statistics.median(samples[n]) for n in candidates] + [
        (max(samples[n]) - min(samples[n])) / 2 for n in candidates
    ]
    agreed = comm.all_reduce(torch.tensor(mine, dtype=torch.float64, device=device), dist.ReduceOp.MAX, op=label)
    figures = agreed.cpu().tolist()
    timings = dict(zip(candidates, figures[: len(candidates)]))
    noise = dict(zip(candidates, figures[len(candidates) :]))
    choice, within = decide(timings, noise)
    decision = Decision(choice, timings, noise, within, sample_bytes)
    remember(key, decision)
    return decision
