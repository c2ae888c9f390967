"""``dp=zero_lab`` through the real ``python train.py``: zero_lab's own engine (ShardedDataParallel)
trains to DDP + Adam's final loss and parameters bitwise, says which engine and modes ran, and
sweeps beside DDP with ``-m dp=ddp,zero_lab``; the embedded default (``dp=auto``, ``optim=zero_adam``)
is the engine, bitwise equal to ``optim=adam dp=ddp``."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests.e2e.runs import REFERENCES, runs_once, session_base, summary

STEPS = ("steps=4", "logger=none")
#: The engine's default modes here: every rank on this one host, through shared memory on x86-64
#: (zero_lab.host_shm), else point-to-point over Gloo.
DEFAULT_MODES = (
    ("shm_reduce_scatter", "shm_all_gather")
    if platform.machine().lower() in ("x86_64", "amd64")
    else ("reduce_scatter", "p2p_all_gather")
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Made together, two at a time, in the session's dir (:func:`~tests.e2e.runs.runs_once`): ``sweep``,
    ``-m dp=ddp,zero_lab`` (job 1 the engine with flat buckets and prefetch, job 0 the same ZeRO-Adam on
    DDP); ``default``, the embedded default (nothing else set); ``adam-ddp``, DDP + Adam (shared)."""
    made = {
        "engine-app-sweep": ((*STEPS, "optim=zero_adam", "dp=ddp,zero_lab", "partitioner=flat", "prefetch=true"), True),
        "engine-app-default": (STEPS, False),
        "adam-ddp": REFERENCES["adam-ddp"],
    }  # fmt: skip
    out = runs_once(session_base(tmp_path_factory), made)
    return {"sweep": out["engine-app-sweep"], "default": out["engine-app-default"], "ddp": out["adam-ddp"]}


def test_engine_trains_to_ddps_loss_and_parameters_bitwise(runs):
    ours, theirs = summary(runs["sweep"] / "1"), summary(runs["ddp"])
    assert ours["losses"] == theirs["losses"] and ours["final_loss"] == theirs["final_loss"]
    assert ours["param_checksum"] == theirs["param_checksum"]
    assert ours["dp"] == "zero_lab" and theirs["dp"] == "ddp" and theirs["engine"] is None
    modes = ours["engine"]
    assert (modes["grad_reduce"], modes["exchange"], modes["prefetch"]) == (*DEFAULT_MODES, True)
    assert 0 < modes["peak_grad_bytes"] <= modes["grad_hold_bound"]
    assert max(ours["optim_state_bytes"]) == pytest.approx(theirs["optim_state_bytes"][0] / 2, rel=0.01)


def test_closing_lines_name_the_engine_and_its_modes(runs):
    shown = (runs["sweep"] / ".done").read_text()  # the sweep's stdout
    grad_reduce, exchange = DEFAULT_MODES
    assert f"data parallel: zero_lab.ShardedDataParallel (dp=zero_lab): grad_reduce={grad_reduce}, " in shown
    assert f"exchange={exchange}, prefetch=true" in shown and "gradients held on rank 0:" in shown


def test_a_sweep_over_dp_runs_both_engines_to_one_loss(runs):
    ddp, engine = summary(runs["sweep"] / "0"), summary(runs["sweep"] / "1")
    assert (ddp["dp"], engine["dp"]) == ("ddp", "zero_lab")
    assert ddp["param_checksum"] == engine["param_checksum"] and ddp["losses"] == engine["losses"]


def test_the_default_job_is_the_engine_bitwise_equal_to_ddp_and_adam(runs):
    default, ddp = summary(runs["default"]), summary(runs["ddp"])
    assert default["choices"]["optim"] == "zero_adam" and default["dp"] == "zero_lab" and default["engine"]
    reason = "dp=auto: a sharded Adam and no key only DDP takes; bitwise DDP + Adam's parameters at W=2"
    assert default["dp_choice"] == {"dp": "zero_lab", "requested": "auto", "reason": reason}
    assert ddp["dp_choice"] == {"dp": "ddp", "requested": "ddp", "reason": "dp=ddp, as set"}
    assert default["losses"] == ddp["losses"] and default["param_checksum"] == ddp["param_checksum"]
    modes = default["engine"]  # the engine's own defaults for this placement: no trial at step 1 adds to the peak
    assert (modes["grad_reduce"], modes["exchange"]) == DEFAULT_MODES and modes["transport_note"] == ""
    assert default["exchange"] is None  # no exchange=auto report: nothing timed candidates at step 1
    shown = (runs["default"] / ".done").read_text()  # its stdout
    assert f"  data parallel: zero_lab.ShardedDataParallel ({reason}): grad_reduce={DEFAULT_MODES[0]}, " in shown
    assert "  data parallel: torch's DDP" not in shown
