"""zero_lab.bench: targets and verdicts, round planning, paired ratios (pure, no processes)."""

from __future__ import annotations

import pytest

from zero_lab.bench import render, rounds, summary, targets
from zero_lab.bench.strategies import STRATEGIES


def _steps(*iters: float) -> list[dict[str, float]]:
    return [{"iter_s": t, "exchange_s": t / 10} for t in iters]


def _run(model: str = "tutorial", **ratios_to_ddp: float) -> dict:
    """A W=2 run whose strategies step in one round at fixed ratios to ddp's 1 s."""
    results = {"ddp": {"steps_by_round": {"0": _steps(1.0, 1.0, 1.0)}, "steps": _steps(1.0, 1.0, 1.0)}}
    for name, ratio in ratios_to_ddp.items():
        steps = _steps(ratio, ratio, ratio)
        results[name] = {"steps_by_round": {"0": steps}, "steps": steps}
    return {"world_size": 2, "model": model, "results": results}


def _verdict(verdicts: list[dict], text_start: str) -> dict:
    (found,) = [v for v in verdicts if v["target"].startswith(text_start)]
    return found


def test_a_miss_inside_the_a_a_band_is_within_noise_and_one_outside_is_missed_by_its_margin() -> None:
    run = _run(ddp_aa=1.04, torch_bv=1.0, zl_flat_bv=1.03, zl_sg=1.10, torch=1.0)
    verdicts = targets.evaluate([run])
    flat = _verdict(verdicts, "zl_flat_bv iteration")
    assert flat["verdict"] == "within noise" and flat["by"] == pytest.approx(0.03)
    assert flat["aa_band"] == pytest.approx(0.04)
    sg = _verdict(verdicts, "zl_sg iteration")
    assert sg["verdict"] == "missed" and sg["by"] == pytest.approx(0.10)
    line = targets.verdict_line(sg)
    assert line.startswith("- missed: tutorial:") and "above the bound by 10.0 %" in line and "A/A band ±4.0 %" in line


def test_without_the_a_a_control_a_miss_is_never_called_noise() -> None:
    verdicts = targets.evaluate([_run(torch_bv=1.0, zl_flat_bv=1.001)])
    assert _verdict(verdicts, "zl_flat_bv iteration")["verdict"] == "missed"


def test_met_targets_and_model_limited_targets() -> None:
    verdicts = targets.evaluate([_run("lm", ddp_aa=1.0, torch_bv=1.0, zl_prefetch=0.5, zl_flat_bv=0.99)])
    assert _verdict(verdicts, "zl_flat_bv iteration")["verdict"] == "met"
    assert not [v for v in verdicts if "best setting" in v["target"]]  # tutorial-only target
    quick = targets.evaluate([_run("tutorial-quick", ddp_aa=1.0, torch_bv=1.0, zl_prefetch=0.9)])
    assert _verdict(quick, "zero_lab's best setting (flat, bucket view, prefetch) iteration ≤ 0.95")["verdict"] == "met"


def test_a_greater_or_equal_target_reports_how_far_below_it_fell() -> None:
    run = _run(zl_sg=1.0, zl_sg_bv=1.0)
    run["results"]["zl_sg"]["steps_by_round"]["0"] = _steps(1.2, 1.2, 1.2)
    (verdict,) = [v for v in targets.evaluate([run]) if "≥ 1.5×" in v["target"]]
    assert verdict["verdict"] == "missed" and verdict["by"] == pytest.approx(0.2)
    assert "below the bound by 20.0 %" in targets.verdict_line(verdict)


def test_memory_choice_and_presence_targets() -> None:
    run = _run()
    run["results"] |= {
        "zl_flat": {"state_bytes": [50, 51]},
        "zl_sg": {"state_bytes": [60, 40]},
        "torch": {"state_bytes": [60, 40]},
        "zl_flat_bv": {"state_bytes": [1, 1], "report": {"collective": "all_gather", "timings_s": {"broadcast": 1}}},
        "fsdp2": {"state_bytes": [1, 1], "steps": _steps(1.0)},
        "fsdp2_reshard": {"state_bytes": [1, 1]},  # memory, but no timing
    }
    run["results"]["ddp"]["state_bytes"] = [100, 100]
    verdicts = targets.evaluate([run])
    assert _verdict(verdicts, "zl_flat Adam state")["measured"] == pytest.approx(0.51)
    assert _verdict(verdicts, "zl_flat Adam state")["verdict"] == "met"
    assert _verdict(verdicts, "zl_sg state bytes")["verdict"] == "met"
    assert _verdict(verdicts, "exchange=auto picks")["verdict"] == "missed"
    assert _verdict(verdicts, "exchange=auto picks")["why"] == "zl_flat_bv timed at its first step: broadcast 1000.0 ms"
    assert _verdict(verdicts, "exchange=auto reports")["measured"] == ("broadcast",)
    assert _verdict(verdicts, "exchange=auto reports")["verdict"] == "missed"
    timings = {"broadcast": 1, "p2p_all_gather": 1}  # every collective auto chooses among (the in-place ones)
    run["results"]["zl_flat_bv"]["report"] = {"collective": "broadcast", "timings_s": timings}
    verdicts = targets.evaluate([run])
    assert _verdict(verdicts, "exchange=auto picks")["verdict"] == "met"
    assert _verdict(verdicts, "exchange=auto reports")["verdict"] == "met"
    assert _verdict(verdicts, "FSDP2 (ZeRO-2-like)")["verdict"] == "met"
    assert _verdict(verdicts, "FSDP2 (ZeRO-3-like)")["verdict"] == "missed"


def test_targets_of_strategies_not_requested_are_left_out_and_verdicts_cite_no_issue() -> None:
    run = _run(ddp_aa=1.0, torch_bv=1.0, zl_flat_bv=1.2)
    assert targets.evaluate([run], requested=["ddp", "torch_bv"]) == []
    assert targets.evaluate([run | {"world_size": 4}]) == []
    for target in targets.TARGETS:
        assert "issue" not in target.text.lower()
        assert target.strategy in STRATEGIES


def test_plan_rounds_puts_everything_in_one_round_when_it_fits() -> None:
    names = ["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv"]
    planned, dropped = rounds.plan_rounds(names, lambda n: 1, budget=10)
    assert len(planned) == 1 and sorted(planned[0]) == sorted(names) and dropped == []


def test_plan_rounds_splits_with_ddp_and_the_reference_in_every_round() -> None:
    names = ["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv", "zl_flat", "zl_flat_bv"]
    planned, dropped = rounds.plan_rounds(names, lambda n: 1, budget=5)
    assert dropped == []
    for members in planned:
        assert members[0] == "ddp" and len(members) <= 5
        assert all(STRATEGIES[n].reference in (None, *members) for n in members)
    assert planned == [
        ["ddp", "torch", "zl_sg", "torch_bv", "zl_sg_bv"],
        ["ddp", "torch", "zl_flat", "torch_bv", "zl_flat_bv"],
    ]


def test_plan_rounds_splits_a_family_then_runs_without_ddp_then_drops() -> None:
    names = ["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv"]
    assert rounds.plan_rounds(names, lambda n: 1, budget=3) == (
        [["ddp", "torch", "zl_sg"], ["ddp", "torch_bv", "zl_sg_bv"]],
        [],
    )
    assert rounds.plan_rounds(names, lambda n: 1, budget=4) == (
        [["torch", "zl_sg", "torch_bv", "zl_sg_bv"], ["ddp"]],
        [],
    )
    cost = {"ddp": 1, "torch": 1, "zl_sg": 5}.__getitem__
    assert rounds.plan_rounds(["ddp", "torch", "zl_sg"], cost, budget=5) == ([["ddp", "torch"]], ["zl_sg"])


def test_fsdp2_rows_are_planned_beside_their_reference_and_as_one_family() -> None:
    planned, _ = rounds.plan_rounds(["ddp", "torch_bv", "fsdp2", "fsdp2_reshard", "ddp_aa"], lambda n: 1, budget=4)
    assert planned == [["ddp", "torch_bv", "fsdp2", "fsdp2_reshard"], ["ddp", "ddp_aa"]]


def test_paired_ratio_is_the_median_of_per_step_ratios() -> None:
    torch_steps, sg_steps, flat_steps = _steps(1.0, 1.0, 10.0), _steps(0.9, 1.1, 9.0), _steps(2.0, 2.0, 2.0)
    results = {
        "torch": {"steps_by_round": {"0": torch_steps}, "steps": torch_steps},
        "zl_sg": {"steps_by_round": {"0": sg_steps}, "steps": sg_steps},
        "zl_flat": {"steps_by_round": {"1": flat_steps}, "steps": flat_steps},
    }
    assert summary.paired_ratio(results, "zl_sg", "torch", "iter_s") == pytest.approx(0.9)
    assert summary.paired_ratio(results, "zl_flat", "torch", "iter_s") == pytest.approx(2.0)  # unpaired: medians
    assert summary.paired_ratio(results, "zl_sg", None, "iter_s") is None


def test_ratios_across_rounds_are_marked_unpaired_in_tables_and_verdicts() -> None:
    steps = _steps(1.0, 1.0)
    results = {
        "ddp": {"steps_by_round": {"0": steps}, "steps": steps},
        "ddp_aa": {"steps_by_round": {"0": steps}, "steps": steps},
        "torch_bv": {"steps_by_round": {"1": steps}, "steps": steps},
        "zl_flat_bv": {"steps_by_round": {"1": _steps(2.0, 2.0)}, "steps": _steps(2.0, 2.0)},
    }
    table = summary.summarize(results, model_bytes=1, planned={})
    assert table["zl_flat_bv"]["unpaired"] == ["iter_vs_ddp"] and table["ddp_aa"]["unpaired"] == []
    text = render.format_table(table, render.SPEED_COLUMNS)
    assert "| zl_flat_bv | 2000.0 | 2.000 | 2.000 † |" in text and "† not timed in the same round" in text
    run = {"world_size": 2, "model": "lm", "results": results | {"zl_prefetch": results["zl_flat_bv"]}}
    (verdict,) = [v for v in targets.evaluate([run]) if v["target"].startswith("zl_flat_bv")]
    assert verdict["paired"] is True
    (versus_ddp,) = [v for v in targets.evaluate([run | {"model": "tutorial"}]) if "DDP + Adam's" in v["target"]]
    assert versus_ddp["paired"] is False and "different rounds" in targets.verdict_line(versus_ddp)


def test_a_missed_timed_target_says_why_in_measured_exchange_figures() -> None:
    run = _run(ddp_aa=1.0, torch_bv=1.0)
    prefetch = [{"iter_s": 1.2, "metered_s": 0.4, "exposed_s": 0.3}] * 3
    run["results"]["zl_prefetch"] = {"steps_by_round": {"0": prefetch}, "steps": prefetch}
    for step in run["results"]["torch_bv"]["steps"]:
        step["exchange_s"] = 0.05
    torch_bv = run["results"]["torch_bv"]  # also timed in a slower round: the reason quotes the paired one
    torch_bv["steps_by_round"]["1"] = _steps(9.0, 9.0, 9.0, 9.0)
    torch_bv["steps"] = torch_bv["steps"] + torch_bv["steps_by_round"]["1"]
    (verdict,) = [v for v in targets.evaluate([run]) if v["target"].endswith("0.95 × torch_bv's")]
    assert verdict["verdict"] == "missed" and verdict["paired"] is True
    assert verdict["why"] == (
        "zl_prefetch iteration 1200.0 ms, exchange exposed 300.0 ms = 25 % of the iteration "
        "(collectives in flight 400.0 ms, summed); torch_bv iteration 1000.0 ms, exchange (step − local step) 50.0 ms"
    )
    assert targets.verdict_line(verdict).endswith("\n  - measured: " + verdict["why"])
    (met,) = [v for v in targets.evaluate([_run(ddp_aa=1.0, torch_bv=1.0, zl_flat_bv=0.9)]) if v["paired"]]
    assert met["verdict"] == "met" and met["why"] == "" and "measured" not in targets.verdict_line(met)


def test_exchange_line_names_the_mode_and_the_timings_it_chose_by() -> None:
    report = {"mode": "flat_broadcast", "requested": "auto", "timings_s": {"broadcast": 0.0123, "all_gather": 0.0456}}
    assert render.exchange_line("zl_flat_bv", report) == (
        "zl_flat_bv: exchange flat_broadcast (requested auto); "
        "timed at the first step (slowest rank): broadcast 12.3 ms, all_gather 45.6 ms"
    )
    forced = {"mode": "flat_all_gather", "requested": "all_gather", "timings_s": {}}
    assert (
        render.exchange_line("zl_flat_bv_ag", forced)
        == "zl_flat_bv_ag: exchange flat_all_gather (requested all_gather)"
    )


def test_quick_runs_every_strategy_a_target_compares() -> None:
    compared = targets.strategies_compared()
    for t in targets.TARGETS:
        names = {t.strategy, t.against or "ddp", STRATEGIES[t.strategy].reference or "ddp"}
        assert names <= set(compared) or t.measure == "present", t.text
    assert compared[:2] == ["ddp", "ddp_aa"]  # the A/A pair
    assert not {"zl_overlap", "fsdp2", "fairscale_oss"} & set(compared)  # rows no target compares stay out


def test_markdown_table_aligns_each_column_and_refuses_a_wrong_spec() -> None:
    table = render.markdown_table(["model", "W", "error"], "lrr", [("tiny", 2, render.error_percent(1.1, 1.0))])
    assert table.splitlines() == ["| model | W | error |", "|---|---:|---:|", "| tiny | 2 | +10.0 % |"]
    assert render.error_percent(1.0, None) == render.error_percent(1.0, 0) == "—"
    with pytest.raises(ValueError, match="align='lr'"):
        render.markdown_table(["a", "b", "c"], "lr", [])
