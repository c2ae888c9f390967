"""scripts/check_model.py's pairing (zero_lab.bench.check_model): a benchmark run's figures beside the step
model's, without processes (the run is a record of the shape zero_lab.bench.run returns)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zero_lab.bench.check_model import Check, checks_for, format_checks, main, read_checks
from zero_lab.bench.hardware import load_hardware
from zero_lab.bench.workloads import MODELS


def test_a_run_is_paired_with_its_predictions() -> None:
    psi = 4 * sum(p.numel() for p in MODELS["tiny"].build().parameters())
    run = {
        "model": "tiny",
        "world_size": 2,
        "results": {
            "ddp": {
                "steps": [{"iter_s": 0.1}, {"iter_s": 0.3}, {"iter_s": 0.2}],
                "collectives": {"grads": {"bytes": psi}},
            },
            "zl_sg_bv": {  # exchange=auto chose all_gather in this world: priced as such
                "steps": [{"iter_s": 0.5}],
                "collectives": {"grads": {"bytes": psi}, "params": {"bytes": 2 * psi}},
                "report": {"collective": "all_gather"},
            },
            "torch_bv": {"steps": [{"iter_s": 0.1}]},  # not a modelled strategy: left out
        },
    }
    checks = {c.strategy: c for c in checks_for(run, load_hardware("gloo_local"))}
    assert set(checks) == {"ddp", "zl_sg_bv"}
    ddp = checks["ddp"]
    assert (ddp.measured_s, ddp.predicted_bytes, ddp.measured_bytes, ddp.exchange) == (0.2, psi, psi, "none")
    greedy = checks["zl_sg_bv"]
    assert greedy.exchange == "all_gather" and greedy.predicted_bytes > 2 * psi  # padded to the fullest owner
    assert greedy.predicted_s > ddp.predicted_s  # the same all-reduce, then an exchange
    table = format_checks(list(checks.values()))
    assert f"| tiny | 2 | 2 | ddp | none | {ddp.predicted_s * 1e3:,.1f} | 200.0 |" in table
    assert table.splitlines()[2].endswith("| +0.0 % |")
    assert checks["ddp"].error(1.0, None) is None and checks["ddp"].error(1.2, 1.0) == pytest.approx(0.2)


def test_the_hierarchical_row_is_priced_over_its_groups() -> None:
    """zl_gr_rs_bc_s2 at W=4 is 2 × 2: predicted with S=2 (p2p inside the pair, then across the 2 replicas)."""
    from zero_lab.bench.check_model import CHECKED, strategies_at
    from zero_lab.planner import specs_from_module
    from zero_lab.step_model import communicator_bytes, predict_step

    steps = [{"iter_s": 0.2}]
    results = {n: {"steps": steps} for n in ("zl_gr_rs_bc", "zl_gr_rs_bc_s2")}
    # the profiler missed the replica all-reduce (500 of 1500 bytes): zero_lab's own count of the reduction is taken
    counted = {"grads": {"bytes": 1000}, "params": {"bytes": 700}, "grad_reduce_own": {"bytes": 1500}}
    results["zl_gr_rs_bc_s2"]["collectives"] = counted
    run = {"model": "tiny", "world_size": 4, "results": results}
    hardware = load_hardware("gloo_local")
    checks = {c.strategy: c for c in checks_for(run, hardware)}
    flat, pairs = checks["zl_gr_rs_bc"], checks["zl_gr_rs_bc_s2"]
    assert (flat.shard_size, pairs.shard_size) == (4, 2)
    assert (pairs.measured_bytes, flat.measured_bytes) == (1500 + 700, None)
    specs = specs_from_module(MODELS["tiny"].build())
    strategy = CHECKED["zl_gr_rs_bc_s2"]
    assert pairs.predicted_s == predict_step(specs, strategy, hardware, 4, 4, 2).seconds
    assert pairs.predicted_bytes == sum(b for b, _ in communicator_bytes(specs, strategy, 4, 0, 2).values())
    assert "| tiny | 4 | 2 | zl_gr_rs_bc_s2 | broadcast |" in format_checks([pairs])
    # run only where it is hierarchical: W=4 (and 8, ...), not W=1, 2 (it would repeat zl_gr_rs_bc) or 3
    names = ["ddp", "zl_gr_rs_bc_s2"]
    assert [strategies_at(names, w) for w in (1, 2, 3, 4)] == [("ddp",)] * 3 + [("ddp", "zl_gr_rs_bc_s2")]


def test_a_stored_check_is_repriced_without_running(tmp_path) -> None:
    """--from: the stored rows' measured figures kept, their predictions the model's now on the
    calibration that run was checked with (kept beside its rows, so gloo_local may be refitted);
    the p2p rows are priced with its one-thread copies (duplex: false)."""
    data = Path(__file__).parents[2] / "docs" / "data"
    stored, fitted = data / "model-check-2026-11-27-idle.json", data / "gloo_local-2026-11-27-1821.yaml"
    _, rows = read_checks(stored)
    checks = main(["--from", str(stored), "--hardware", str(fitted), "--out", str(tmp_path)])
    assert [(c.model, c.world_size, c.strategy, c.measured_s) for c in checks] == [
        (r.model, r.world_size, r.strategy, r.measured_s) for r in rows
    ]
    assert all(c.predicted_bytes == c.measured_bytes for c in checks)
    assert read_checks(tmp_path / "model_check.json")[1] == checks
    # a calibration older than the p2p_reduce_scatter op: its rows priced as before, and the header says so
    assert "the profile has no p2p_reduce_scatter fit: not measured" in (tmp_path / "model_check.md").read_text()
    # the W = 4 rows (4 ranks on 2 cores) are priced on the profile's crowded W = 4 fits, the others not
    from dataclasses import replace

    from zero_lab.bench.check_model import recheck

    gloo = load_hardware(fitted)
    even = {(c.model, c.strategy, c.world_size): c.predicted_s for c in recheck(rows, replace(gloo, crowded={}))}
    moved = {
        (c.model, c.strategy, c.world_size) for c in checks if c.predicted_s != even[c.model, c.strategy, c.world_size]
    }
    assert moved and {w for _, _, w in moved} == {4}


#: The latest idle check (docs/benchmarks.md) and the calibration it fitted first: the issue's bars.
LATEST = ("model-check-2026-11-28-0358-idle-repeats.json", "gloo_local-2026-11-28-0358-idle.yaml")


def test_the_latest_idle_check_meets_the_bars_with_the_model_as_it_is(tmp_path) -> None:
    """Every row of the committed idle check, re-priced by the model and its own calibration as they
    are now: time within ±20 % of the measured median, bytes within ±2 % (exact, in fact); the
    gradient phase of zl_gr_rs_bc included (the busiest rank on two cores, the bucket's total on a
    crowded host). A change to the model that breaks a measured row fails here, without a run."""
    data = Path(__file__).parents[2] / "docs" / "data"
    checks = main(["--from", str(data / LATEST[0]), "--hardware", str(data / LATEST[1]), "--out", str(tmp_path)])
    assert len(checks) == 32 and {c.world_size for c in checks} == {1, 2, 4}
    misses = [(c.model, c.world_size, c.strategy, Check.error(c.predicted_s, c.measured_s)) for c in checks]
    assert [m for m in misses if abs(m[3]) > 0.20] == []
    assert all(abs(Check.error(c.predicted_bytes, c.measured_bytes) or 0.0) <= 0.02 for c in checks)


def test_repeats_are_combined_into_the_median_and_its_band(tmp_path) -> None:
    """--repeats: a row per configuration, every repeat's time kept, the median checked, the band
    (min–max) shown; a repeat that timed nothing is left out; rows from before the repeats still load."""
    from zero_lab.bench.check_model import combine, write_checks

    def row(strategy: str, measured: float | None, world: int = 2) -> Check:
        return Check("tiny", world, world, strategy, 0.25, measured, 100, 100, "broadcast")

    repeats = [
        [row("ddp", 0.30), row("zl_flat_bv_bc", 0.20), row("ddp", 0.1, world=4)],
        [row("ddp", 0.10), row("zl_flat_bv_bc", None), row("ddp", 0.2, world=4)],
        [row("ddp", 0.20), row("zl_flat_bv_bc", 0.40), row("ddp", 0.3, world=4)],
    ]
    ddp, flat, four = combine(repeats)
    assert (ddp.measured_runs, ddp.measured_s, ddp.band) == ((0.30, 0.10, 0.20), 0.20, (0.10, 0.30))
    assert (flat.measured_runs, flat.measured_s, flat.band) == ((0.20, 0.40), pytest.approx(0.30), (0.20, 0.40))
    assert (four.world_size, four.measured_s) == (4, 0.2)
    assert ddp.error(ddp.predicted_s, ddp.measured_s) == pytest.approx(0.25)  # against the median
    assert combine([[row("ddp", None)]])[0].measured_s is None
    table = format_checks([ddp])
    assert "| tiny | 2 | 2 | ddp | broadcast | 250.0 | 200.0 | 100.0–300.0 | +25.0 % |" in table
    # written and read back with the runs; a row written before the repeats has no band
    write_checks(tmp_path / "c.json", [ddp], "header")
    assert read_checks(tmp_path / "c.json")[1] == [ddp]
    old = {k: v for k, v in ddp.as_dict().items() if k != "measured_runs"}
    assert Check.from_dict(old).band is None and "| 200.0 | — |" in format_checks([Check.from_dict(old)])
    with pytest.raises(ValueError, match=r"missing \['exchange'\], unknown \['runs'\]"):
        Check.from_dict({k: v for k, v in old.items() if k != "exchange"} | {"runs": []})


def test_calibrate_needs_a_directory_and_no_other_profile(capsys) -> None:
    for argv in (["--calibrate"], ["--calibrate", "--out", "d", "--hardware", "h100_ib"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert "--repeats 0: give at least 1" in capsys.readouterr().err
