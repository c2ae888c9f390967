"""``dp=auto`` (zero_lab/app/plan/data_parallel.py), every case of its rule on composed configs: a plain
optimizer trains on DDP, a ``zero_*`` one on the engine unless a key only the DDP path takes is set
(then DDP, the key named in the reason), and ``dp=ddp`` / ``dp=zero_lab`` are taken as given. The
config check, the plan and the build read the same answer; auto never resolves into a refusal."""

from __future__ import annotations

import pytest

from tests.preflight import compose_job, preflight, problems, sweep_jobs
from zero_lab.app.plan.data_parallel import DpChoice, ddp_only_settings, parity_with_ddp, resolve_dp
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.plan.strategy import ENGINE


def choice(*overrides: str) -> DpChoice:
    cfg, _, _ = compose_job(list(overrides))
    return resolve_dp(cfg, OptimPlan.of(cfg.optim))


def test_the_default_job_trains_on_the_engine():
    cfg, _ = preflight([])
    assert str(cfg.dp.value) == "auto"
    assert choice() == DpChoice(
        "zero_lab", "auto", "dp=auto: a sharded Adam and no key only DDP takes; bitwise DDP + Adam's parameters at W=2"
    )
    assert RunPlan.of(cfg).dp.dp == "zero_lab"


def test_the_reason_claims_bitwise_only_where_the_engine_is():
    # at W >= 3 the engine's reduce-scatter sums in another order than DDP's ring: not bitwise
    assert choice("dist.world_size=3").reason == (
        "dp=auto: a sharded Adam and no key only DDP takes; "
        "DDP + Adam's parameters up to rounding at W=3, not bitwise (another summation order)"
    )
    assert choice("dist.world_size=1").reason.endswith("; bitwise DDP + Adam's parameters at W=1")
    assert parity_with_ddp(None, "AdamW") == "DDP + AdamW's parameters bitwise at W <= 2, up to rounding from W=3"


@pytest.mark.parametrize("optim", ["zero_adam", "zero_adamw", "zero_sgd", "zero_muon"])
def test_every_sharding_optimizer_alone_takes_the_engine(optim):
    assert choice(f"optim={optim}").dp == "zero_lab"


@pytest.mark.parametrize("optim", ["adam", "adamw", "sgd", "muon"])
def test_a_plain_optimizer_takes_ddp(optim):
    made = choice(f"optim={optim}")
    assert (made.dp, made.requested) == ("ddp", "auto")
    assert made.reason.startswith("dp=auto: a plain ") and made.reason.endswith(", its whole state on every rank")


#: The DDP path's gradient-release key (``release_grads``): it needs a ``grad_reduce`` hook.
RELEASE = next(key for key in ENGINE.unused_keys if key not in ("overlap", "bucket_view"))
DDP_ONLY = [
    *(f"{key}=true" for key in ENGINE.unused_keys),  # overlap, bucket_view, the DDP path's gradient release
    "compile=true",
    "autocast=fp16",
    "param_dtype=bfloat16",  # the engine would step fp32 main copies: not DDP + Adam's bf16 numbers
    "param_dtype=float16",
    "overlap_hook=interleaved",
    "dist.find_unused_parameters=true",
    "dist.static_graph=true",
    "dist.bucket_cap_mb=5.0",
    "optim.master_weights=true",  # the ZeRO wrapper's own key: the engine has no such argument
]


@pytest.mark.parametrize("setting", DDP_ONLY)
def test_a_key_only_the_ddp_path_takes_selects_ddp_and_is_named(setting):
    needs = ("grad_reduce=reduce_scatter",) if setting.startswith(RELEASE) else ()
    made = choice("optim=zero_adam", setting, *needs)
    assert made == DpChoice("ddp", "auto", f"dp=auto: {setting} only the DDP path takes")
    cfg, _ = preflight(["optim=zero_adam", setting, *needs])  # accepted: never an engine refusal
    assert RunPlan.of(cfg).dp.dp == "ddp"


def test_several_ddp_only_keys_are_all_named():
    cfg, _, _ = compose_job(["overlap=true", "bucket_view=true", "dist.static_graph=true"])
    assert ddp_only_settings(cfg, OptimPlan.of(cfg.optim)) == ["bucket_view=true", "overlap=true",
                                                                "dist.static_graph=true"]  # fmt: skip


ENGINE_TAKES = [
    "exchange=broadcast",
    "exchange=auto",
    "grad_reduce=reduce_scatter",
    "grad_reduce=auto",
    "grad_reduce=all_reduce",
    "prefetch=true",
    "autocast=bf16",
    "partitioner=ddp_bucket",
    "partitioner=flat",
    "accumulate=2",
    "optim.max_grad_norm=1.0",
    "dist.broadcast_buffers=false",
    "checkpoint_every=5",
    "checkpoint_format=dcp",
    "optim.lr=0.01",
]


@pytest.mark.parametrize("setting", ENGINE_TAKES)
def test_keys_the_engine_takes_keep_the_engine(setting):
    assert choice("optim=zero_adam", setting).dp == "zero_lab"


@pytest.mark.parametrize("asked", ["ddp", "zero_lab"])
@pytest.mark.parametrize("optim", ["adam", "zero_adam"])
def test_an_explicit_dp_is_taken_as_given(asked, optim):
    assert choice(f"optim={optim}", f"dp={asked}") == DpChoice(asked, asked, f"dp={asked}, as set")


def test_an_explicit_engine_still_refuses_what_it_does_not_take():
    assert choice("dp=zero_lab", "overlap=true").dp == "zero_lab"  # not switched behind the user's back
    assert "overlap=true: dp=zero_lab does not take it yet" in problems("dp=zero_lab", "overlap=true")


def test_an_optimizer_that_cannot_be_looked_up_is_taken_as_ddp():
    cfg, _, _ = compose_job([])
    assert resolve_dp(cfg, None).dp == "ddp"


def test_both_paths_stay_sweepable():
    assert sweep_jobs(["dp=ddp,zero_lab,auto"]) == [["dp=ddp"], ["dp=zero_lab"], ["dp=auto"]]
    preflight(["dp=ddp,zero_lab"], multirun=True)
