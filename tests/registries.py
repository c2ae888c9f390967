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
    """``report`` (an exchange or gradient report with ``auto``'s figures) obeys the rule of
    :mod:`zero_lab.auto`, stated from its definition: the choice is within the noise of the
    fastest, no candidate preferred to it is, and ``within_noise`` lists exactly the others
    within the noise of the choice."""
    timings, noise = report["timings_s"], report["noise_s"]
    chosen = report.get("collective", report.get("strategy"))
    assert tuple(timings) == preference, (tuple(timings), preference)
    assert set(noise) == set(timings) and all(t > 0 for t in timings.values())

    def alike(a: str, b: str) -> bool:
        band = max(noise[a] + noise[b], margin * min(timings[a], timings[b]))
        return abs(timings[a] - timings[b]) <= band

    fastest = min(timings, key=timings.__getitem__)
    assert alike(chosen, fastest), report
    assert not any(alike(name, fastest) for name in preference[: preference.index(chosen)]), report
    assert report["within_noise"] == [n for n in preference if n != chosen and alike(n, chosen)], report
