"""Registrations and ``auto`` decisions made inside a test, undone after it.

The core keeps one registry per phase (``exchange=``: :mod:`zero_lab.collectives`,
``grad_reduce=``: :mod:`zero_lab.grad_reduce`) and one table of ``auto`` decisions per
process (:mod:`zero_lab.auto`); the package offers no way to take a registration back,
since a job never needs one. Tests that register strategies of their own (a slow one, a
clashing one) restore both as they found them::

    with restored_registries():
        register_collective(SlowBroadcast)
        ...                                  # SlowBroadcast is gone afterwards
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from zero_lab import auto, collectives, grad_reduce


@contextmanager
def restored_registries() -> Iterator[None]:
    """Both phases' registries and the process's ``auto`` decisions, as they were on entry, at exit."""
    kept = [(table, dict(table._entries)) for table in (collectives._REGISTRY, grad_reduce._REGISTRY)]
    decisions = dict(auto._DECISIONS)
    try:
        yield
    finally:
        for table, entries in kept:
            table._entries.clear()
            table._entries.update(entries)
        auto._DECISIONS.clear()
        auto._DECISIONS.update(decisions)


@contextmanager
def no_decisions() -> Iterator[None]:
    """No ``auto`` decision remembered on entry (the next ``auto`` measures); the old ones back at exit."""
    with restored_registries():
        auto._DECISIONS.clear()
        yield


def assert_auto_rule(report: dict, preference: tuple[str, ...], margin: float = 0.10) -> None:
    """``report`` (an exchange or gradient report with ``auto``'s figures) is consistent with the rule
    of :mod:`zero_lab.auto`, stated from its definition: the figures are in preference order; a
    candidate preferred to the choice was passed over only for one faster than it by more than the
    margin; the choice is never slower than the fastest by more than the margin unless the samples
    did not say so clearly (it is then a near-tie, reported in ``within_noise``)."""
    timings, noise = report["timings_s"], report["noise_s"]
    chosen = report.get("collective", report.get("strategy"))
    assert tuple(timings) == preference, (tuple(timings), preference)
    assert set(noise) == set(timings) and all(t > 0 for t in timings.values())
    fastest = min(timings.values())
    for passed_over in preference[: preference.index(chosen)]:
        assert timings[passed_over] > fastest * (1 + margin), report
    assert chosen not in report["within_noise"] and set(report["within_noise"]) <= set(preference), report
    if timings[chosen] > fastest * (1 + margin):  # a slower choice stands only beside a near-tie
        faster = [name for name, t in timings.items() if t * (1 + margin) < timings[chosen]]
        assert set(faster) <= set(report["within_noise"]), report
