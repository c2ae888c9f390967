"""A sweep job that would train what an earlier one trained is found by its claim in the sweep
dir (zero_lab/app/launch/repeats.py): only once the earlier job finished, never its own (requeued)
claim, and the keys a plain optimizer ignores make no difference to the digest, nor ``dp=auto`` against
the path it resolves to (``-m dp=auto,zero_lab``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.preflight import compose_job
from zero_lab.app.check.rules import to_container
from zero_lab.app.launch.repeats import REPEAT_FILE, Original, claim, job_key, read_repeat, why_repeat, write_repeat
from zero_lab.app.plan.data_parallel import resolve_dp
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.record.summary import SUMMARY_FILE

CONFIG = {"optim": {"_target_": "torch.optim.Adam", "lr": 1e-3}, "partitioner": {"_target_": "Flat"}, "steps": 2}


def test_the_digest_ignores_only_the_keys_named_unused():
    other = CONFIG | {"partitioner": {"_target_": "SortedGreedy"}}
    unused = ("partitioner", "bucket_view")
    assert job_key(CONFIG, unused) == job_key(other, unused)
    assert job_key(CONFIG, ()) != job_key(other, ())
    assert job_key(CONFIG, unused) != job_key(CONFIG | {"steps": 3}, unused)


def test_a_later_job_repeats_a_finished_earlier_one_only(tmp_path: Path):
    first, second = tmp_path / "0", tmp_path / "1"
    first.mkdir()
    second.mkdir()
    key = job_key(CONFIG, ("partitioner",))
    assert claim(tmp_path, key, first, ["optim=adam", "partitioner=flat"]) is None  # claimed: run it
    assert claim(tmp_path, key, second, ["optim=adam", "partitioner=sorted_greedy"]) is None  # job 0 still running
    (first / SUMMARY_FILE).write_text(json.dumps({"losses": [1.0], "steps": 2, "stopped_by": None}))
    assert claim(tmp_path, key, second, []) is None  # stopped after 1 of 2 steps: not what job 1 would train
    (first / SUMMARY_FILE).write_text(json.dumps({"losses": [1.0, 0.5], "steps": 2, "stopped_by": "SIGTERM"}))
    assert claim(tmp_path, key, second, []) is None
    (first / SUMMARY_FILE).write_text(json.dumps({"losses": [1.0, 0.5], "steps": 2, "stopped_by": None}))
    found = claim(tmp_path, key, second, ["optim=adam", "partitioner=sorted_greedy"])
    assert found == Original(first, ["optim=adam", "partitioner=flat"])
    assert claim(tmp_path, key, first, []) is None  # a requeued job 0 finds its own claim and runs
    assert claim(tmp_path, job_key(CONFIG, ()), second, []) is None  # another digest: its own claim
    # the claims are files: the sweep dir's folders stay its jobs (scripts and tests list them by is_dir)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0", "1"]


def test_a_repeat_is_recorded_and_read_back(tmp_path: Path):
    original = Original(tmp_path / "0", ["optim=adam", "partitioner=flat"])
    write_repeat(tmp_path, original, ["optim=adam", "partitioner=sorted_greedy"], ["partitioner=sorted_greedy"])
    assert (
        json.loads((tmp_path / REPEAT_FILE).read_text())
        == read_repeat(tmp_path)
        == {
            "repeat_of": str(tmp_path / "0"),
            "its_overrides": ["optim=adam", "partitioner=flat"],
            "overrides": ["optim=adam", "partitioner=sorted_greedy"],
            "not_used": ["partitioner=sorted_greedy"],
        }
    )
    assert read_repeat(tmp_path / "nowhere") is None


def test_dp_auto_and_the_path_it_resolves_to_are_one_job():
    # -m dp=auto,zero_lab: the zero_* job of dp=auto trains on the engine, the dp=zero_lab job's path and modes
    jobs = {dp: compose_job([f"dp={dp}"])[0] for dp in ("auto", "zero_lab", "ddp")}
    keys = {}
    for dp, cfg in jobs.items():
        optim = OptimPlan.of(cfg.optim)
        keys[dp] = job_key(to_container(cfg), optim.strategy.unused_keys, resolve_dp(cfg, optim).dp)
    assert keys["auto"] == keys["zero_lab"] != keys["ddp"]
    plain = [compose_job(["optim=adam", f"dp={dp}"])[0] for dp in ("auto", "zero_lab")]  # auto: DDP + Adam
    assert len({job_key(to_container(c), (), resolve_dp(c, OptimPlan.of(c.optim)).dp) for c in plain}) == 2
    assert why_repeat(["dp=zero_lab"], ["dp=auto"], [], "torch.optim.Adam", "zero_lab") == (
        "dp=zero_lab: dp=auto resolves to dp=zero_lab here, the same path and modes, so"
    )
    assert why_repeat(["steps=2"], ["steps=2"], [], "x", "ddp") == "its overrides: the same config, so"
    assert why_repeat(["partitioner=flat"], [], ["partitioner=flat"], "torch.optim.Adam", "ddp") == (
        "partitioner=flat: not used by torch.optim.Adam, a plain optimizer, so"
    )
