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
2. **Timed.** One untimed round of every candidate (a collective's first uses pay its setup);
   its times, agreed over the group (MAX), say how many trials make one sample: enough for a
   sample to last :data:`SAMPLE_S` (at most :data:`MAX_TRIALS`), since a sample of a few
   milliseconds on a loaded machine measures the scheduler more than the collective. Then
   :data:`TUNE_REPS` timed rounds, the candidates in an order rotated by one each round (every
   candidate takes every place equally often), so a drift of the load favours none.
3. **Agreed samples.** One all-reduce MAX over the group makes each sample the slowest rank's
   (every rank ran the same round at the same time), so every rank decides from the same
   figures, the same way. A candidate's time is the median of its samples; its noise, for the
   report, half their interquartile range.
4. **The rule** (:func:`decide`). ``a`` is *clearly faster* than ``b`` when its median is below
   ``b``'s by more than :data:`AUTO_MARGIN` (10 %) *and* the samples say so beyond the noise:
   at least :data:`CLEAR` (80 %) of the pairs (a sample of ``a``, a sample of ``b``) have ``a``
   the faster — a comparison of the two samples' ranks, which one disturbed sample (a loaded
   machine gives heavy tails) cannot sway. The choice is the first candidate, in preference
   order, that no other candidate is clearly faster than (the fastest median always
   qualifies). So near-equal candidates resolve to the preferred one (the same config, the
   same choice), and only a clearly faster one displaces it. :attr:`Decision.within_noise`
   lists the other candidates neither clearly faster nor clearly slower than the choice; the
   phase's report carries it, so a summary says when the choice was a near-tie.
5. **Confirmed.** When the rule finds a difference — it displaces the preferred candidate, or
   judges another clearly slower than the choice — a second round of as many samples is timed and
   the rule decides again on both rounds together (the report's figures are theirs). A difference
   that one disturbed round produced between candidates doing the same work (under load a
   point-to-point trial is bimodal: both ranks scheduled, or one waiting a time slice; the medians
   of two identical candidates read up to 5 × apart in one round here) is not taken, neither as a
   displacement nor as a "clearly slower" in the report (two rounds' worth of pairs must still say
   80 %); a clearly faster candidate stays clearly faster. Every rank decides from the same
   agreed figures, so every rank times the second round or none does.

    decision = tune(key, comm, ["broadcast", "p2p_all_gather"], trial, device=dev, sample_bytes=n, label="tune")
    decision.choice, decision.within_noise   # "broadcast", ("p2p_all_gather",)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator

__all__ = [
    "AUTO_MARGIN",
    "CLEAR",
    "MAX_TRIALS",
    "SAMPLE_S",
    "TUNE_REPS",
    "Decision",
    "decide",
    "decided",
    "remember",
    "tune",
]

#: The least relative gap between two candidates' median times that can count as "clearly faster".
AUTO_MARGIN = 0.10
#: The least share of sample pairs in which the faster candidate must be faster (of 12 × 12 pairs,
#: two disturbed samples of the faster one still leave it clear).
CLEAR = 0.8
#: Timed samples of every candidate (the median is its time); a multiple of 2, 3 and 4, so the
#: rotation gives every candidate every place equally often for up to four candidates.
TUNE_REPS = 12
#: The least time one sample should last (trials of a candidate back to back).
SAMPLE_S = 0.01
#: The most trials in one sample.
MAX_TRIALS = 16


@dataclass(frozen=True)
class Decision:
    """An ``auto`` choice and what it was made from (seconds, max over the group's ranks).

    ``timings_s``: each candidate's median time; ``noise_s``: half its interquartile range; ``within_noise``:
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


def clearly_faster(a: Sequence[float], b: Sequence[float], margin: float = AUTO_MARGIN) -> bool:
    """Whether samples ``a`` are clearly faster than samples ``b`` (the module docstring, step 4)."""
    if statistics.median(a) * (1 + margin) >= statistics.median(b):
        return False
    wins = sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in a for y in b)
    return wins >= CLEAR * len(a) * len(b)


def decide(samples: Mapping[str, Sequence[float]], margin: float = AUTO_MARGIN) -> tuple[str, tuple[str, ...]]:
    """``(choice, the other candidates within the noise of it)`` from each candidate's timed samples;
    ``samples`` is in preference order (see the module docstring, step 4)."""
    if not samples:
        raise ValueError("auto: no candidate to choose from (register one)")

    def beaten(name: str) -> bool:
        return any(clearly_faster(samples[other], samples[name], margin) for other in samples if other != name)

    choice = next(name for name in samples if not beaten(name))
    within = tuple(
        name
        for name in samples
        if name != choice
        and not clearly_faster(samples[name], samples[choice], margin)
        and not clearly_faster(samples[choice], samples[name], margin)
    )
    return choice, within


# key -> decision, for this process
_DECISIONS: dict[tuple[Hashable, ...], Decision] = {}


def decided(key: tuple[Hashable, ...]) -> Decision | None:
    """The decision this process took earlier under ``key``, if any."""
    return _DECISIONS.get(key)


def remember(key: tuple[Hashable, ...], decision: Decision) -> None:
    """Keep ``decision`` for later ``auto``\\ s with the same ``key`` (every rank of a group keeps the
    same: the figures are agreed by an all-reduce and every rank decides the same keys in order)."""
    _DECISIONS[key] = decision


def _half_iqr(values: Sequence[float]) -> float:
    """Half the interquartile range (inclusive quartiles: of 5 values, the 2nd and 4th smallest)."""
    if len(values) < 2:
        return 0.0
    first, _, third = statistics.quantiles(values, n=4, method="inclusive")
    return (third - first) / 2


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

    def timed(name: str, trials: int = 1) -> float:
        start = time.perf_counter()
        for _ in range(trials):
            trial(name)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / trials

    warm = max(timed(name) for name in candidates)
    slowest = comm.all_reduce(torch.tensor([warm], dtype=torch.float64, device=device), dist.ReduceOp.MAX, op=label)
    trials = max(1, min(MAX_TRIALS, math.ceil(SAMPLE_S / max(float(slowest.item()), 1e-9))))

    def agreed_round() -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for rep in range(TUNE_REPS):
            shift = rep % len(candidates)
            for name in [*candidates[shift:], *candidates[:shift]]:
                samples[name].append(timed(name, trials))
        mine = torch.tensor([samples[n] for n in candidates], dtype=torch.float64, device=device)
        return dict(zip(candidates, comm.all_reduce(mine, dist.ReduceOp.MAX, op=label).cpu().tolist()))

    agreed = agreed_round()
    choice, within = decide(agreed)
    if choice != candidates[0] or len(within) < len(candidates) - 1:  # step 5: a difference, on twice the samples
        again = agreed_round()
        agreed = {name: agreed[name] + again[name] for name in candidates}
        choice, within = decide(agreed)
    timings = {n: statistics.median(agreed[n]) for n in candidates}
    noise = {n: _half_iqr(agreed[n]) for n in candidates}
    decision = Decision(choice, timings, noise, within, sample_bytes)
    remember(key, decision)
    return decision
