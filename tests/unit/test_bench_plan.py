"""zero_lab.bench.plan (scripts/plan.py): the planner's table for a model at a world size it cannot run."""

from __future__ import annotations

import pytest

from zero_lab.bench import plan


def test_plan_cli_prints_a_table(capsys) -> None:
    plans = plan.main(["--model", "lm", "--world-size", "1024", "--partitioner", "flat"])
    out = capsys.readouterr().out
    assert "W=1024" in out and "Flat()" in out and "| DDP + Adam |" in out
    assert [p["world_size"] for p in plans] == [1024, 1024]
    assert plans[1]["summary"]["state_bytes"]["max"] < plans[0]["summary"]["state_bytes"]["max"] / 1000


def test_plan_plot_writes_a_figure_per_model_and_the_tables(tmp_path, capsys) -> None:
    argv = ["--hardware", "h100_ib", "--model", "tiny", "linear768", "--world-size", "8", "64", "--shard-size", "8"]
    argv += ["--strategies", "ddp", "zero1_flat", "--plot", str(tmp_path)]
    rows = plan.main(argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["at_scale-linear768.png", "at_scale-tiny.png", "at_scale.md"]
    assert (tmp_path / "at_scale-tiny.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    tables = (tmp_path / "at_scale.md").read_text()
    assert tables.startswith("`python scripts/plan.py --hardware h100_ib --model tiny linear768")
    assert tables.count("| strategy | S | W=8 | W=64 |") == 2  # one summary per model
    # per model: ddp at W = 8, 64; zero1_flat at S = W (8, 64) and S = 8 at W = 64
    assert len(rows) == 2 * 5 and "figure: " in capsys.readouterr().out


def test_plot_without_hardware_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        plan.main(["--model", "tiny", "--plot", str(tmp_path)])
    assert "--plot draws the step model's rows: give --hardware too" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
