"""The benchmark's targets, as data, and the verdict on each from one run's tables.

A :class:`Target` names what is measured (an iteration-time or exchange-time ratio
between two strategies of the same run, a state-bytes ratio or equality, the exchange
collective zero_lab chose and the candidates it timed, or the presence of a row), the
bound, and the models it applies to. Targets hold at W=2 (the benchmark's main world).

Verdicts: ``met``; ``within noise`` when a timed ratio misses its bound by no more than
the run's A/A band (``|ddp_aa ÷ ddp − 1|``, two identical strategies measured the same
way: a difference that small is not a difference); ``missed`` otherwise, with the
margin in per cent; ``info`` for figures printed for comparison only. A timed verdict
says whether its ratio is paired (both strategies in one round) and, unless met, *why*
in measured figures: each side's iteration and exchange time, and for zero_lab how much
of the time its collectives were in flight the loop stayed blocked (exposed)::

    verdicts = evaluate(runs)      # one dict per (target, model) that this run measured
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zero_lab.bench.strategies import STRATEGIES
from zero_lab.bench.summary import common_rounds, median_ms, paired, paired_ratio
from zero_lab.exchange import auto_collectives

__all__ = ["TARGETS", "Target", "aa_band", "evaluate", "strategies_compared", "verdict_line", "why"]


@dataclass(frozen=True)
class Target:
    """One promise about a W=2 run.

    ``measure``: ``iter`` (median paired iteration-time ratio ``strategy ÷ against``),
    ``exchange`` (the same for exchange time), ``state`` (worst-rank state bytes ÷
    ``against``'s), ``state_equal`` (the same bytes on every rank), ``choice`` (the value
    of ``key`` in the strategy's own report equals ``bound``), ``candidates`` (the
    collectives timed in the report's ``timings_s`` are ``bound``), ``present`` (the row has both
    memory and time figures). ``op`` is ``<=`` or ``>=`` for ratios. ``models``
    limits the target to those models (``-quick`` variants included); empty: all.
    """

    text: str
    measure: str
    strategy: str
    against: str | None = None
    op: str = "<="
    bound: float | str | tuple[str, ...] | None = None
    models: tuple[str, ...] = ()
    key: str | None = None

    @property
    def timed(self) -> bool:
        return self.measure in ("iter", "exchange")

    def applies_to(self, model: str) -> bool:
        return not self.models or model.removesuffix("-quick") in self.models


TARGETS: tuple[Target, ...] = (
    Target("zl_flat_bv iteration ≤ torch_bv's", "iter", "zl_flat_bv", "torch_bv", "<=", 1.00),
    Target(
        "zero_lab's best setting (flat, bucket view, prefetch) iteration ≤ 0.95 × torch_bv's",
        "iter",
        "zl_prefetch",
        "torch_bv",
        "<=",
        0.95,
        ("tutorial",),
    ),
    Target(
        "zero_lab's best setting (flat, bucket view, prefetch) iteration ≤ DDP + Adam's",
        "iter",
        "zl_prefetch",
        "ddp",
        "<=",
        1.00,
        ("tutorial",),
    ),
    Target(
        "exchange=auto picks broadcast for flat on Gloo", "choice", "zl_flat_bv", bound="broadcast", key="collective"
    ),
    Target(
        "exchange=auto reports the time of every candidate collective",
        "candidates",
        "zl_flat_bv",
        bound=tuple(sorted(auto_collectives())),
    ),
    Target("FSDP2 (ZeRO-2-like) row has memory and time", "present", "fsdp2"),
    Target("FSDP2 (ZeRO-3-like) row has memory and time", "present", "fsdp2_reshard"),
    Target("zl_flat Adam state ≤ 0.51 × DDP's (worst rank)", "state", "zl_flat", "ddp", "<=", 0.51),
    Target("zl_sg state bytes == torch's on every rank", "state_equal", "zl_sg", "torch"),
    Target("zl_sg_bv state bytes == torch_bv's on every rank", "state_equal", "zl_sg_bv", "torch_bv"),
    Target("zl_sg iteration ≤ torch's", "iter", "zl_sg", "torch", "<=", 1.00),
    Target("zl_sg_bv iteration ≤ torch_bv's", "iter", "zl_sg_bv", "torch_bv", "<=", 1.00),
    Target("zl_flat iteration ≤ torch's", "iter", "zl_flat", "torch", "<=", 1.00),
    Target(
        "bucket view speeds the exchange up ≥ 1.5× (zl_sg ÷ zl_sg_bv exchange time)",
        "exchange",
        "zl_sg",
        "zl_sg_bv",
        ">=",
        1.5,
        ("tutorial",),
    ),
    Target("torch's own exchange, per tensor ÷ bucket view (for comparison)", "exchange", "torch", "torch_bv"),
)


def strategies_compared() -> list[str]:
    """The strategies some target compares (a ratio, equal bytes, the exchange choice; not rows a
    ``present`` target only asks for), their references and the A/A pair (``ddp``, ``ddp_aa``),
    in the order of ``STRATEGIES``. ``--quick`` runs these alone."""
    names = {"ddp", "ddp_aa"} | {n for t in TARGETS if t.measure != "present" for n in (t.strategy, t.against) if n}
    names |= {STRATEGIES[n].reference for n in names if STRATEGIES[n].reference}
    return [n for n in STRATEGIES if n in names]


def aa_band(results: dict[str, Any]) -> float | None:
    """The run's timing noise: ``|median paired (ddp_aa ÷ ddp) − 1|``, or None without the A/A rows."""
    ratio = paired_ratio(results, "ddp_aa", "ddp", "iter_s")
    return None if ratio is None else abs(ratio - 1.0)


def _measured(target: Target, results: dict[str, Any]) -> Any:
    one, other = results.get(target.strategy), results.get(target.against or "")
    if target.measure in ("iter", "exchange"):
        key = "iter_s" if target.measure == "iter" else "exchange_s"
        return paired_ratio(results, target.strategy, target.against, key)
    if one is None or (target.against and other is None) or "state_bytes" not in one:
        return None
    if target.measure == "state":
        return max(one["state_bytes"]) / max(other["state_bytes"])
    if target.measure == "state_equal":
        return one["state_bytes"] == other["state_bytes"]
    if target.measure == "choice":
        return (one.get("report") or {}).get(target.key or "")
    if target.measure == "candidates":
        return tuple(sorted((one.get("report") or {}).get("timings_s") or {}))
    raise ValueError(f"unknown target measure {target.measure!r}")


def _judge(target: Target, value: Any, band: float | None) -> tuple[str, float | None]:
    """The verdict and, for a ratio that misses, by how much (fraction of the bound)."""
    if target.measure == "present":
        return ("met" if value else "missed"), None
    if target.measure in ("state_equal", "choice", "candidates"):
        return ("met" if value == (True if target.measure == "state_equal" else target.bound) else "missed"), None
    if target.bound is None:
        return "info", None
    bound = float(target.bound)
    met = value <= bound if target.op == "<=" else value >= bound
    if met:
        return "met", None
    by = value / bound - 1.0 if target.op == "<=" else 1.0 - value / bound
    if target.timed and band is not None and by <= band:
        return "within noise", by
    return "missed", by


def why(results: dict[str, Any], names: Sequence[str]) -> str:
    """Measured figures behind a timed verdict: per strategy, its median iteration and exchange
    times (over the round both ran in, when they did: the steps the paired ratio compares).

    For zero_lab, its own meter: the exchange time the loop was blocked (exposed) and
    the collectives' time from issue to completion, summed over collectives (several in
    flight at once count each, so the sum can exceed the wall time); for the others, the
    exchange is ``step()`` − local step where it happens inside ``step()``.
    """
    parts, shared = [], common_rounds(results, *names[:2]) if len(names) > 1 else []
    for name in names:
        row = results.get(name, {})
        steps = row["steps_by_round"][shared[0]] if shared else row.get("steps", [])
        iteration = median_ms(steps, "iter_s")
        if iteration is None:
            continue
        text = f"{name} iteration {iteration:.1f} ms"
        in_flight, exposed = median_ms(steps, "metered_s"), median_ms(steps, "exposed_s")
        if STRATEGIES[name].zero_lab and in_flight and exposed is not None:
            text += (
                f", exchange exposed {exposed:.1f} ms = {100 * exposed / iteration:.0f} % of the iteration "
                f"(collectives in flight {in_flight:.1f} ms, summed)"
            )
        elif STRATEGIES[name].exchange_in_step and STRATEGIES[name].sharded:
            exchange = median_ms(steps, "exchange_s")
            text += "" if exchange is None else f", exchange (step − local step) {exchange:.1f} ms"
        parts.append(text)
    return "; ".join(parts)


def _why_chosen(results: dict[str, Any], name: str) -> str:
    """The timings an ``exchange="auto"`` choice was made by (slowest rank, first step)."""
    timings = (results.get(name, {}).get("report") or {}).get("timings_s") or {}
    measured = ", ".join(f"{collective} {1e3 * seconds:.1f} ms" for collective, seconds in timings.items())
    return f"{name} timed at its first step: {measured}" if measured else ""


def _reason(target: Target, results: dict[str, Any]) -> str:
    if target.timed:
        return why(results, [target.strategy, target.against or ""])
    return _why_chosen(results, target.strategy) if target.measure == "choice" else ""


def evaluate(runs: Sequence[dict[str, Any]], requested: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Verdicts of every target on every W=2 run whose strategies were requested."""
    out = []
    for run in (r for r in runs if r["world_size"] == 2):
        results, model = run["results"], run["model"]
        band = aa_band(results)
        names = set(requested if requested is not None else results)
        for target in TARGETS:
            needed = {target.strategy, target.against} - {None}
            if not target.applies_to(model) or not needed <= names:
                continue
            if target.measure == "present":
                row = results.get(target.strategy, {})
                value: Any = "state_bytes" in row and bool(row.get("steps"))
            else:
                value = _measured(target, results)
            if value is None:
                continue
            verdict, by = _judge(target, value, band)
            timed = target.timed
            out.append(
                {"model": model, "target": target.text, "measured": value, "bound": target.bound, "op": target.op}
                | {"verdict": verdict, "by": by, "aa_band": band if timed else None}
                | {"paired": paired(results, target.strategy, target.against) if timed else None}
                | {"why": _reason(target, results) if verdict != "met" else ""}
            )
    return out


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple | list):
        return ", ".join(map(str, value)) or "none"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def verdict_line(v: dict[str, Any]) -> str:
    """One printed line: verdict, model, target, the measured figure, the margin and the A/A band."""
    extra = []
    if v["by"] is not None:
        extra.append(f"{'above' if v['op'] == '<=' else 'below'} the bound by {100 * v['by']:.1f} %")
    if v["aa_band"] is not None:
        extra.append(f"A/A band ±{100 * v['aa_band']:.1f} %")
    if v.get("paired") is False:
        extra.append("timed in different rounds: a ratio of medians, not paired")
    tail = f" ({'; '.join(extra)})" if extra else ""
    reason = f"\n  - measured: {v['why']}" if v.get("why") else ""
    return f"- {v['verdict']}: {v['model']}: {v['target']}: {_value(v['measured'])}{tail}{reason}"
