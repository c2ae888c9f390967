"""zero_lab.bench.plan (scripts/plan.py): the planner's table for a model at a world size it cannot run."""

from __future__ import annotations

from zero_lab.bench import plan


def test_plan_cli_prints_a_table(capsys) -> None:
    plans = plan.main(["--model", "lm", "--world-size", "1024", "--partitioner", "flat"])
    out = capsys.readouterr().out
    assert "W=1024" in out and "Flat()" in out and "| DDP + Adam |" in out
    assert [p["world_size"] for p in plans] == [1024, 1024]
    assert plans[1]["summary"]["state_bytes"]["max"] < plans[0]["summary"]["state_bytes"]["max"] / 1000
