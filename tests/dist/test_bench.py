"""scripts/bench.py: round planning and ratios (pure), and one tiny end-to-end run.

Nothing here asserts a timing: only structure and exact, deterministic figures
(state bytes, bytes exchanged, the planner's prediction).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import bench


def test_plan_rounds_puts_everything_in_one_round_when_it_fits() -> None:
    names = ["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv"]
    rounds, dropped = bench.plan_rounds(names, lambda n: 1, budget=10)
    assert len(rounds) == 1 and sorted(rounds[0]) == sorted(names) and dropped == []


def test_plan_rounds_splits_with_ddp_and_the_reference_in_every_round() -> None:
    names = ["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv", "zl_flat", "zl_flat_bv"]
    rounds, dropped = bench.plan_rounds(names, lambda n: 1, budget=5)
    assert dropped == []
    assert sorted({n for r in rounds for n in r}) == sorted(names)
    for members in rounds:
        assert members[0] == "ddp" and len(members) <= 5
        for name in members:
            ref = bench.STRATEGIES[name].reference
            assert ref is None or ref in members
    assert rounds == [
        ["ddp", "torch", "zl_sg", "torch_bv", "zl_sg_bv"],
        ["ddp", "torch", "zl_flat", "torch_bv", "zl_flat_bv"],
    ]


def test_plan_rounds_splits_a_family_that_does_not_fit_together() -> None:
    rounds, dropped = bench.plan_rounds(["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv"], lambda n: 1, budget=3)
    assert rounds == [["ddp", "torch", "zl_sg"], ["ddp", "torch_bv", "zl_sg_bv"]] and dropped == []


def test_plan_rounds_runs_a_family_without_ddp_before_splitting_it() -> None:
    names = ["ddp", "torch", "torch_bv", "zl_sg", "zl_sg_bv"]
    rounds, dropped = bench.plan_rounds(names, lambda n: 1, budget=4)
    assert rounds == [["torch", "zl_sg", "torch_bv", "zl_sg_bv"], ["ddp"]] and dropped == []


def test_plan_rounds_drops_what_cannot_fit_even_alone() -> None:
    names = ["ddp", "torch", "zl_sg"]
    rounds, dropped = bench.plan_rounds(names, lambda n: 5 if n == "zl_sg" else 1, budget=5)
    assert rounds == [["ddp", "torch"]] and dropped == ["zl_sg"]


def test_the_a_a_control_runs_beside_ddp() -> None:
    rounds, _ = bench.plan_rounds(["ddp", "ddp_aa", "torch", "zl_sg"], lambda n: 1, budget=3)
    assert rounds == [["ddp", "torch", "zl_sg"], ["ddp", "ddp_aa"]]


def _steps(*iters: float) -> list[dict[str, float]]:
    return [{"iter_s": t, "exchange_s": t / 10} for t in iters]


def test_paired_ratio_is_the_median_of_per_step_ratios() -> None:
    torch_steps, sg_steps, flat_steps = _steps(1.0, 1.0, 10.0), _steps(0.9, 1.1, 9.0), _steps(2.0, 2.0, 2.0)
    results = {
        "torch": {"steps_by_round": {"0": torch_steps}, "steps": torch_steps},
        "zl_sg": {"steps_by_round": {"0": sg_steps}, "steps": sg_steps},
        "zl_flat": {"steps_by_round": {"1": flat_steps}, "steps": flat_steps},
    }
    assert bench.paired_ratio(results, "zl_sg", "torch", "iter_s") == pytest.approx(0.9)
    assert bench.paired_ratio(results, "zl_flat", "torch", "iter_s") == pytest.approx(2.0)  # unpaired: medians
    assert bench.paired_ratio(results, "zl_sg", None, "iter_s") is None


def test_tiny_end_to_end_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    strategies = ["ddp", "ddp_aa", "torch", "torch_bv", "zl_sg", "zl_sg_bv", "zl_flat", "zl_overlap_il"]
    argv = ["--models", "tiny", "--world-sizes", "2", "--warmup", "1", "--steps", "2", "--start-method", "forkserver"]
    report = bench.main([*argv, "--strategies", *strategies, "--out", str(out)])
    printed = capsys.readouterr().out
    assert "| zl_flat |" in printed and "Targets (W=2)" in printed
    assert json.loads(out.read_text())["command"].startswith("python scripts/bench.py")
    (run,) = report["runs"]
    results, table = run["results"], run["table"]
    assert len(run["rounds"]) == 1 and sorted(run["rounds"][0]) == sorted(strategies)
    assert results["zl_sg"]["state_bytes"] == results["torch"]["state_bytes"]  # same owners as torch's class
    assert all(table[n]["planned_state_ok"] for n in ("ddp", "torch", "zl_sg", "zl_sg_bv", "zl_flat"))
    assert table["zl_flat"]["state_vs_ddp"] <= 0.51
    for name in ("torch", "torch_bv", "zl_sg", "zl_sg_bv", "zl_overlap_il"):
        assert table[name]["bytes_vs_min"] == pytest.approx(1.0), name  # every element once
    assert table["zl_sg_bv"]["calls_per_step"] == 2 and table["torch_bv"]["calls_per_step"] == 2
    assert len(results["zl_sg"]["steps"]) == 2 and all(s["iter_s"] > 0 for s in results["zl_sg"]["steps"])
    assert max(table[n]["max_abs_diff_vs_ddp"] for n in strategies) < 1e-5
    assert table["ddp_aa"]["iter_vs_ddp"] is not None and table["ddp_aa"]["iter_vs_torch"] is None
    assert table["ddp"]["bytes_vs_min"] is None and table["zl_overlap_il"]["exchange_ms"] is None
    assert {t["target"] for t in report["targets"]} >= {"zl_flat Adam state ≤ 0.51 × DDP's (worst rank)"}
    again = bench.main(["--report", str(out)])  # re-rendered from the raw figures alone
    assert again["runs"][0]["table"]["zl_flat"] == table["zl_flat"]
    assert "re-rendered" in capsys.readouterr().out


def test_collectives_check_times_three_transports(capsys) -> None:
    out = bench.main(
        ["--collectives", "--models", "tiny", "--world-sizes", "2", "--steps", "2", "--start-method", "forkserver"]
    )
    (row,) = out["collectives"]
    assert set(row["ms"]) == {"all_gather_into_tensor", "one broadcast per rank", "one broadcast per tensor"}
    assert "| tiny (6 tensors) | 2 |" in capsys.readouterr().out
