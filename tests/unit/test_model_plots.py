"""The step model's figures (zero_lab.report.model_plots) from rows built here, and the model check's JSON
(zero_lab.bench.check_model.write_checks / read_checks) read back equal."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from zero_lab.bench.check_model import Check, read_checks, write_checks
from zero_lab.report.model_plots import (
    at_scale_figure,
    model_check_figure,
    plot_at_scale,
    plot_model_check,
    shard_label,
)

PNG = b"\x89PNG\r\n\x1a\n"
GIB = 2**30


def at_scale_rows(model: str = "tutorial") -> list[dict]:
    """Two strategies at W = 8, 64, 1024: ddp at S = W only, zero1_flat at S = 8 (W > 8) and S = W."""
    rows = []
    for world in (8, 64, 1024):
        rows.append(dict(model=model, strategy="ddp", world_size=world, shard_size=world, predicted_s=world * 1e-3,
                         memory_bytes=3 * GIB))  # fmt: skip
        for shard in sorted({8, world}):
            rows.append(dict(model=model, strategy="zero1_flat", world_size=world, shard_size=shard,
                             predicted_s=shard * 2e-3, memory_bytes=GIB + GIB // shard))  # fmt: skip
    return rows


def test_at_scale_figure_one_line_per_strategy_and_shard(tmp_path: Path) -> None:
    rows = at_scale_rows()
    fig = at_scale_figure(rows, "tutorial on round numbers")
    time_ax, memory_ax = fig.axes[:2]
    lines = {line.get_label(): line for line in time_ax.get_lines()}
    # ddp S=W, zero1_flat S=W and zero1_flat S=8 (one point at W=8 is S=W, so S=8 holds W = 64, 1024)
    assert sorted(lines) == ["ddp S=W", "zero1_flat S=8", "zero1_flat S=W"]
    assert list(lines["zero1_flat S=8"].get_xdata()) == [64, 1024]
    assert list(lines["zero1_flat S=W"].get_ydata()) == pytest.approx([16.0, 128.0, 2048.0])  # ms
    assert len(memory_ax.get_lines()) == 3
    memory = {line.get_label(): list(line.get_ydata()) for line in memory_ax.get_lines()}
    assert memory["zero1_flat S=8"] == pytest.approx([1.125, 1.125])  # GiB
    assert time_ax.get_xscale() == "log" and time_ax.get_yscale() == "log"
    assert [t.get_text() for t in time_ax.get_xticklabels()] == ["8", "64", "1,024"]
    assert "step time" in time_ax.get_ylabel() and "memory per rank" in memory_ax.get_ylabel()
    assert "world size W" in time_ax.get_xlabel()
    plt.close(fig)
    path = plot_at_scale(rows, tmp_path / "sub" / "at_scale-tutorial.png", "tutorial")
    assert path.read_bytes().startswith(PNG)
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary left beside it


def test_at_scale_refuses_several_models(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one model, got \\['tutorial', 'gpt2-xl'\\]"):
        plot_at_scale(at_scale_rows() + at_scale_rows("gpt2-xl"), tmp_path / "x.png", "both")
    assert not (tmp_path / "x.png").exists()


def test_shard_label() -> None:
    assert shard_label({"world_size": 4, "shard_size": 4}) == "S=W"
    assert shard_label({"world_size": 4, "shard_size": 2}) == "S=2"
    assert shard_label({"world_size": 4}) == "S=W"


def checks() -> list[Check]:
    return [
        Check("linear768", 2, 2, "ddp", 0.100, 0.110, 1000, 1000, "none"),
        Check("linear768", 4, 4, "zl_flat_bv_bc", 0.200, 0.150, 3000, 3030, "broadcast"),
        Check("linear768", 4, 2, "zl_gr_rs_bc_s2", 0.120, 0.125, 2000, 2000, "broadcast"),
        Check("tiny", 1, 1, "zl_gr_rs_bc", 0.010, None, 0, 0, "broadcast"),  # nothing measured: left out
    ]


def test_model_check_figure_points_band_and_bytes(tmp_path: Path) -> None:
    rows = [c.as_dict() for c in checks()]
    fig = model_check_figure(rows, "W = 1-4, under load (load 9.0)")
    time_ax, bytes_ax = fig.axes[:2]
    points = [tuple(c.get_offsets()[0]) for c in time_ax.collections[1:]]  # [0] is the ±20 % band
    assert points == [pytest.approx((110.0, 100.0)), pytest.approx((150.0, 200.0)), pytest.approx((125.0, 120.0))]
    assert time_ax.collections[3].get_paths()[0] is not None and len(time_ax.collections) == 4
    assert [t.get_text() for t in time_ax.texts] == ["1", "2", "3"]  # the rows' numbers, keyed on the right
    band = time_ax.collections[0].get_paths()[0].vertices
    low, high = time_ax.get_xlim()
    assert band[:, 1].min() == pytest.approx(0.8 * low) and band[:, 1].max() == pytest.approx(1.2 * high)
    legend = [t.get_text() for t in time_ax.get_legend().get_texts()]
    assert "±20% of measured" in legend and any("hierarchical" in t for t in legend)
    assert "1 row(s) without a measured time left out" in time_ax.get_title()
    assert time_ax.get_xlabel().startswith("measured step time") and time_ax.get_ylabel().startswith("predicted")
    widths = [bar.get_width() for bar in bytes_ax.patches if bar.get_height() == pytest.approx(0.6)]
    assert widths == pytest.approx([0.0, 100 * (3000 - 3030) / 3030, 0.0, 0.0])  # % error, one bar per row
    assert [t.get_text() for t in bytes_ax.texts] == ["+0.0 %", "-1.0 %", "+0.0 %", "nothing counted"]
    key = [t.get_text() for t in bytes_ax.get_yticklabels()]
    assert key[2] == "3  linear768 W=4 S=2 zl_gr_rs_bc_s2" and key[3] == "4  tiny W=1 zl_gr_rs_bc"
    assert "%" in bytes_ax.get_xlabel() and fig.texts[0].get_text() == "W = 1-4, under load (load 9.0)"
    assert len(time_ax.lines) == 1  # the y = x line: no repeats, no band bars
    plt.close(fig)
    assert plot_model_check(rows, tmp_path / "model_check.png", "t").read_bytes().startswith(PNG)
    # with repeats, a bar from the fastest to the slowest run at the predicted time
    rows[0]["measured_runs"] = [0.100, 0.110, 0.130]
    fig = model_check_figure(rows, "repeats")
    bars = [line.get_data() for line in fig.axes[0].lines if len(line.get_xdata()) == 2 and line.get_ydata()[0] == 100]
    assert [(list(x), list(y)) for x, y in bars] == [([100.0, 130.0], [100.0, 100.0])]
    plt.close(fig)


def test_checks_json_round_trips(tmp_path: Path) -> None:
    written = checks()
    path = write_checks(tmp_path / "model_check.json", written, "`python scripts/check_model.py` — idle")
    header, read = read_checks(path)
    assert header == "`python scripts/check_model.py` — idle" and read == written
    assert read[3].measured_s is None and read[2].shard_size == 2


def test_a_row_with_a_field_missing_is_refused() -> None:
    record = checks()[0].as_dict()
    del record["shard_size"]
    with pytest.raises(ValueError, match=r"missing \['shard_size'\], unknown \['extra'\]"):
        Check.from_dict(record | {"extra": 1})
