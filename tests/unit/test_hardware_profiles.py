"""Hardware profiles (zero_lab.bench.hardware), the calibration's fit (zero_lab.bench.calibrate) and
``scripts/plan.py --hardware`` (zero_lab.bench.plan, zero_lab.bench.at_scale)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from zero_lab.bench import plan
from zero_lab.bench.calibrate import Rate, duplex_from, fit_error, fit_link, profile_from, refit
from zero_lab.bench.hardware import OLD_P2P_NOTE, PROFILE_DIR, hardware_from_dict, load_hardware, profile_names
from zero_lab.collective_cost import Collective, Link, seconds


def test_every_shipped_profile_loads_and_names_its_sources() -> None:
    assert {"h100_ib", "a100_hdr", "gloo_local"} <= set(profile_names())
    for name in profile_names():
        hardware = load_hardware(name)
        assert hardware.name == name
        assert {"matmul_flops", "memory_bandwidth"} <= set(hardware.sources)
    for name in ("h100_ib", "a100_hdr"):
        sources = load_hardware(name).sources
        assert all("https://" in sources[key] for key in ("matmul_flops", "intra", "inter", "bus_bandwidth"))
    h100 = load_hardware("h100_ib")
    assert (h100.intra.bus_bandwidth, h100.inter.bus_bandwidth, h100.ranks_per_node) == (450e9, 50e9, 8)
    gloo = load_hardware("gloo_local")
    ops = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "p2p_reduce_scatter"}
    assert gloo.cores and set(gloo.collectives) == set(gloo.large_collectives) == ops
    assert gloo.large_from_bytes == 32 * 2**20 and "largest relative error" in gloo.sources["fit_errors"]


def test_a_bad_profile_names_every_problem_and_the_file(tmp_path) -> None:
    data = yaml.safe_load((PROFILE_DIR / "h100_ib.yaml").read_text())
    del data["matmul_flops"]
    data["nics"] = 8
    data["links"] = {"intra": data["links"]["intra"]}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"broken.yaml: missing key 'matmul_flops'; unknown key 'nics'; links must"):
        load_hardware(path)
    with pytest.raises(ValueError, match=r"--hardware 'tpu': no such profile; pick one of \['a100_hdr'"):
        load_hardware("tpu")
    data = yaml.safe_load((PROFILE_DIR / "h100_ib.yaml").read_text())
    data["links"]["inter"] = {"alpha_s": 1e-6}
    with pytest.raises(ValueError, match=r"links\.inter must be a mapping with exactly alpha_s and bus_bandwidth"):
        hardware_from_dict(data, "x.yaml")


def test_the_fit_recovers_alpha_and_bandwidth() -> None:
    truth = dataclasses.replace(load_hardware("h100_ib"), intra=Link(2e-5, 3e9))
    collectives = [Collective("all_reduce", n, w) for w in (2, 4) for n in (2**18, 2**21, 2**24)]
    fitted = fit_link([(c, seconds(truth, c)) for c in collectives])
    assert fitted.alpha_s == pytest.approx(2e-5, rel=1e-6) and fitted.bus_bandwidth == pytest.approx(3e9, rel=1e-6)
    # a negative intercept is clamped to 0 and the bandwidth refitted through the origin, on the
    # relative errors: B = Σ r² / Σ r with r = bytes / seconds of each point
    clamped = fit_link([(Collective("broadcast", 10**6, 2), 1e-4), (Collective("broadcast", 2 * 10**6, 2), 3e-4)])
    r = (10**6 / 1e-4, 2 * 10**6 / 3e-4)
    assert clamped.alpha_s == 0.0 and clamped.bus_bandwidth == pytest.approx((r[0] ** 2 + r[1] ** 2) / sum(r))


def test_the_fit_minimizes_the_relative_error_across_sizes() -> None:
    """0.25 to 64 MiB, the largest slower per byte than the rest: the fit is the least-squares
    optimum of the points' relative errors (moving α or B either way makes their sum of squares
    worse), so the small points are not given up for the large one's milliseconds."""
    sizes = [2**18, 2**21, 2**24, 2**26]
    times = [4e-4, 1.5e-3, 9e-3, 7e-2]  # the 64 MiB point ~2x slower per byte than 16 MiB's
    points = [(Collective("all_gather", n, 2), t) for n, t in zip(sizes, times)]
    fit = fit_link(points)

    def squares(link: Link) -> float:
        return sum(fit_error(link, c, t) ** 2 for c, t in points)

    best = squares(fit)
    for alpha, bandwidth in ((1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)):
        assert squares(Link(fit.alpha_s * alpha, fit.bus_bandwidth * bandwidth)) > best
    assert max(abs(fit_error(fit, c, t)) for c, t in points) < 0.5


def test_a_calibration_makes_a_profile_that_loads() -> None:
    rows = [
        {"op": op, "world_size": w, "nbytes": n, "seconds": 1e-4 * w + n / 1e9}
        for op in ("all_reduce", "broadcast")
        for w in (2, 4)
        for n in (2**20, 2**24)
    ]
    compute = {"matmul_flops": Rate(4e10, (2.0, 4.0, 3.0)), "memory_bandwidth": Rate(1e10, (2.0, 2.5))}
    profile = profile_from(rows, compute, "python scripts/calibrate.py", 2)
    hardware = hardware_from_dict(yaml.safe_load(yaml.safe_dump(profile)))
    assert set(hardware.collectives) == {"all_reduce", "broadcast"} and hardware.cores == 2
    assert "python scripts/calibrate.py" in hardware.sources["collectives"]
    # the fastest block's rate, the spread kept beside it
    assert (hardware.matmul_flops, hardware.memory_bandwidth) == (2e10, 5e9)
    assert "20 GFLOP/s (blocks: min 10, median 13.3, max 20)" in hardware.sources["matmul_flops"]
    assert hardware.duplex and "no one-way messages measured" in hardware.sources["duplex"]


def test_a_crowded_world_is_fitted_on_its_own_points() -> None:
    """W = 4 on 2 cores: its ops fitted on its rows alone (an α-β different from W = 2's), its
    per-rank compute rates kept; the W = 2 world, which has a core per rank, is not crowded."""
    h100 = load_hardware("h100_ib")
    truths = {2: Link(1e-4, 2e9), 4: Link(2e-3, 1e9)}  # one core per rank; 4 ranks on 2 cores
    rows = [
        {"op": "all_reduce", "world_size": w, "nbytes": n, "seconds": seconds(truth, Collective("all_reduce", n, w))}
        for w, link in truths.items()
        for truth in [dataclasses.replace(h100, collectives={"all_reduce": link})]
        for n in (2**18, 2**21, 2**24)
    ]
    rows += [
        {"op": "matmul_flops", "world_size": 4, "rate": 3.5e10},
        {"op": "memory_bandwidth", "world_size": 4, "rate": 7e9},
    ]
    compute = {"matmul_flops": Rate(8e10, (1.0,)), "memory_bandwidth": Rate(1.6e10, (1.0,))}
    profile = yaml.safe_load(yaml.safe_dump(profile_from(rows, compute, "python scripts/calibrate.py", 2)))
    assert list(profile["crowded"]) == [4] and "each op fitted on that world" in profile["sources"]["crowded"]
    hardware = hardware_from_dict(profile)
    fit = hardware.crowded[4].collectives["all_reduce"]
    assert fit.alpha_s == pytest.approx(2e-3, rel=1e-3) and fit.bus_bandwidth == pytest.approx(1e9, rel=1e-3)
    assert (hardware.crowded[4].matmul_flops, hardware.crowded[4].memory_bandwidth) == (3.5e10, 7e9)
    four = hardware.on_host(4)
    assert four.collectives["all_reduce"] == fit and four.matmul_flops == 3.5e10
    assert hardware.on_host(2).collectives["all_reduce"] == hardware.collectives["all_reduce"]  # the joint fit
    # --refit: the same sections from the stored rows, nothing run; a profile without rows is refused
    again = refit(dict(profile, crowded={}))  # from the rows as stored (4 significant digits)
    refitted = again["crowded"][4]["collectives"]["all_reduce"]
    assert refitted == pytest.approx({"alpha_s": 2e-3, "bus_bandwidth": 1e9}, rel=1e-3)
    assert again["crowded"][4]["matmul_flops"] == 3.5e10 and list(again)[-2:] == ["sources", "measured"]
    with pytest.raises(ValueError, match="--refit: the profile has no measured rows"):
        refit({"name": "x"})
    with pytest.raises(ValueError, match=r"crowded\.4 must be a mapping of some of"):
        hardware_from_dict(dict(profile, crowded={4: {"links": {}}}), "p.yaml")


def test_the_shipped_gloo_profile_prices_four_ranks_from_its_four_rank_points() -> None:
    """gloo_local's crowded W = 4 fits come from its own measured W = 4 rows, nothing else: below
    32 MiB α and B, from 32 MiB on B alone at that α; each row's fit_error is against its own fit."""
    gloo = load_hardware("gloo_local")
    data = yaml.safe_load((PROFILE_DIR / "gloo_local.yaml").read_text())
    for op in ("broadcast", "all_reduce", "p2p_reduce_scatter"):
        four = [r for r in data["measured"] if r["world_size"] == 4 and r["op"] == op]
        small = fit_link([(Collective(op, r["nbytes"], 4), r["seconds"]) for r in four if r["nbytes"] < 2**25])
        large = [(Collective(op, r["nbytes"], 4), r["seconds"]) for r in four if r["nbytes"] >= 2**25]
        large_fit = fit_link(large, alpha_s=small.alpha_s)
        crowded = gloo.crowded[4]
        assert crowded.collectives[op].bus_bandwidth == pytest.approx(small.bus_bandwidth, rel=1e-3)
        assert crowded.collectives[op].alpha_s == pytest.approx(small.alpha_s, rel=1e-3, abs=1e-9)
        assert crowded.large_collectives[op].bus_bandwidth == pytest.approx(large_fit.bus_bandwidth, rel=1e-3)
        for row, (collective, t) in zip([r for r in four if r["nbytes"] >= 2**25], large):
            assert row["fit_error"] == pytest.approx(fit_error(crowded.large_collectives[op], collective, t), abs=2e-3)


def test_a_rate_is_its_fastest_block_with_the_spread() -> None:
    rate = Rate(12.0, (4.0, 3.0, 6.0))  # 3, 4 and 2 per second
    assert rate.value == 4.0 and rate.spread == (2.0, 3.0, 4.0)
    assert rate.describe(1.0, "x/s") == "4 x/s (blocks: min 2, median 3, max 4)"


def test_duplex_is_a_one_way_message_near_a_swaps_time() -> None:
    def rows(one_way: float) -> list[dict]:
        sizes = [(2, 2**20), (2, 2**24), (4, 2**24), (2, 2**10)]
        swaps = [{"op": "send_recv", "world_size": w, "nbytes": n, "seconds": 0.010} for w, n in sizes]
        ways = [{"op": "send_one_way", "world_size": w, "nbytes": n, "seconds": one_way} for w, n in sizes[:3]]
        # a small message is latency: not counted even when it disagrees
        return swaps + ways + [{"op": "send_one_way", "world_size": 2, "nbytes": 2**10, "seconds": 0.1}]

    assert duplex_from(rows(0.005)) == (
        False,
        "a one-way message takes 0.50 x a swap's time (median of 3; > 0.75: duplex)",
    )
    assert duplex_from(rows(0.009))[0] is True


def test_plan_with_hardware_prints_the_at_scale_table_and_crossings(capsys) -> None:
    rows = plan.main(
        ["--hardware", "h100_ib", "--model", "tutorial", "--world-size", "8", "64", "--shard-size", "1", "8"]
    )
    keys = {(r["strategy"], r["world_size"], r["shard_size"]) for r in rows}
    assert ("ddp", 64, 64) in keys and ("ddp", 64, 8) not in keys
    assert {("zero2_engine", 64, s) for s in (1, 8, 64)} <= keys
    by = {(r["strategy"], r["world_size"], r["shard_size"]): r for r in rows}
    ddp_state = by[("ddp", 64, 64)]["state_bytes"]
    assert by[("zero1_flat", 64, 64)]["state_bytes"] == pytest.approx(ddp_state / 64, rel=0.01)
    assert by[("zero1_flat", 64, 8)]["state_bytes"] == pytest.approx(ddp_state / 8, rel=0.01)
    # 20 equal layers (+ biases) over 64 owners: a layer's state on the fullest, 64 / 20 × the mean
    assert by[("zero1_sorted_greedy", 64, 64)]["imbalance"] == pytest.approx(64 / 20, rel=0.01)
    out = capsys.readouterr().out
    assert "| W | S | strategy |" in out and "sorted_greedy's imbalance (3.20)" in out


def test_large_messages_are_fitted_apart_and_priced_by_their_size() -> None:
    """An all-gather that moves 2 GB/s of bus bytes below 32 MiB and 1 GB/s from there on (as
    Gloo's here slows past 16 MiB): the calibration fits each range (the large one's B at the
    small one's α), every point lands on its fit, and the model prices a message by its size."""
    mib = 2**20
    small, large = Link(1e-4, 2e9), Link(1e-4, 1e9)

    def all_gather(n: int, w: int) -> float:  # ring: W-1 steps, (W-1)/W of S through each rank
        link = large if n >= 32 * mib else small
        return (w - 1) * link.alpha_s + (w - 1) / w * n / link.bus_bandwidth

    sizes = [mib // 4, 2 * mib, 16 * mib, 32 * mib, 64 * mib]
    rows = [{"op": "all_gather", "world_size": 2, "nbytes": n, "seconds": all_gather(n, 2)} for n in sizes]
    compute = {"matmul_flops": Rate(8e10, (1.0,)), "memory_bandwidth": Rate(1.6e10, (1.0,))}
    profile = yaml.safe_load(yaml.safe_dump(profile_from(rows, compute, "python scripts/calibrate.py", 2)))
    hardware = hardware_from_dict(profile)
    assert hardware.large_from_bytes == 32 * mib
    with pytest.raises(ValueError, match="large_collectives needs large_from_bytes > 0"):
        hardware_from_dict(dict(profile, large_from_bytes=None), "p.yaml")
    for fitted, truth in (
        (hardware.collectives["all_gather"], small),
        (hardware.large_collectives["all_gather"], large),
    ):
        assert (fitted.alpha_s, fitted.bus_bandwidth) == pytest.approx((truth.alpha_s, truth.bus_bandwidth), rel=1e-3)
    assert all(r["fit_error"] == pytest.approx(0.0, abs=2e-3) for r in profile["measured"])
    for n in (16 * mib, 61 * mib):  # the tutorial's 61 MiB exchange at the large messages' rate
        assert seconds(hardware, Collective("all_gather", n, 2)) == pytest.approx(all_gather(n, 2), rel=1e-3)
    # one fit over every size (--large-from-mib 0) misses some point by far more: the reason for two
    single = refit(profile, large_from=None)
    assert "large_collectives" not in single and "large_from_bytes" not in single
    assert max(abs(r["fit_error"]) for r in single["measured"]) > 0.2
    assert "all_gather" in single["sources"]["fit_errors"]


def test_a_calibration_older_than_the_p2p_op_loads_refits_and_says_so() -> None:
    """The idle calibration of 2026-11-27 23:30 (sizes up to 16 MiB, no p2p_reduce_scatter): it
    loads with a note on the missing op, and --refit keeps it one range (no size reaches 32 MiB)."""
    path = Path(__file__).parents[2] / "docs" / "data" / "gloo_local-2026-11-27-2330-idle.yaml"
    hardware = load_hardware(path)
    assert "p2p_reduce_scatter" not in hardware.collectives
    assert hardware.sources["p2p_reduce_scatter"] == OLD_P2P_NOTE
    again = refit(yaml.safe_load(path.read_text()))
    assert "large_collectives" not in again and again["crowded"][4]["matmul_flops"] == 35490000000.0
    assert {r["op"] for r in again["measured"] if "fit_error" in r} == {
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "send_recv",
    }
    assert hardware_from_dict(again).collectives.keys() == hardware.collectives.keys()
