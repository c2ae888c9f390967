"""The run plan (zero_lab/app/plan/run_plan.py): one meta model per job, read by every check and
by the task; specs routed to the classes that step them, so memory and partition agree."""

from __future__ import annotations

from typing import ClassVar

import torch

from tests.preflight import compose_job, preflight, problems
from zero_lab.app.check.callback import check_unless_checked
from zero_lab.app.check.notices import notices
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.workloads.models import MLP
from zero_lab.optimizer import check_partition_fits
from zero_lab.planner import plan_memory, whole_state_bytes


class CountingMLP(MLP):
    """The shipped MLP, counting how often it is built (and on which device)."""

    built: ClassVar[list[str]] = []

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        CountingMLP.built.append(next(self.parameters()).device.type)


def test_a_checked_job_builds_its_model_once_and_the_task_reads_that_plan():
    CountingMLP.built.clear()
    overrides = [f"model._target_={__name__}.CountingMLP", "optim=zero_adam", "overlap=true", "dist.world_size=2"]
    cfg, hydra = preflight(overrides)  # every rule: arguments, forward, partition, memory, notices' inputs
    assert CountingMLP.built == ["meta"]
    plan = check_unless_checked(cfg, hydra, None)  # the task: the check's own plan, nothing built again
    assert notices(cfg, overrides, plan) == []
    assert CountingMLP.built == ["meta"]
    assert [s.name for s in plan.specs] == [name for name, _ in plan.model.value.named_parameters()]


def test_zero_muon_prices_memory_by_the_classes_its_partition_routes_to():
    cfg, _, _ = compose_job(["optim=zero_muon", "dist.world_size=2"])
    plan = RunPlan.of(cfg)
    specs = plan.specs
    assert {s.stepper for s in specs} == {"Muon", "AdamW"}
    assert all(s.stepper == "Muon" and not s.elementwise for s in specs if s.shape and len(s.shape) == 2 and
               s.name not in ("layers.0.weight", f"layers.{cfg.model.depth - 1}.weight"))  # fmt: skip
    classes = {"Muon": torch.optim.Muon, "AdamW": torch.optim.AdamW}
    assert {s.kind for s in specs} == {"cpu/torch.float32"}
    whole = sum(whole_state_bytes(classes[s.stepper], s.shape, torch.float32) for s in specs if s.trainable)
    assert plan.memory(None, world_size=1).ranks[0].state_bytes == whole
    as_adamw = plan_memory(specs, 1, None, torch.optim.AdamW).ranks[0].state_bytes
    assert as_adamw > whole  # what the memory check priced before: every parameter as AdamW
    partition = plan.partition()
    check_partition_fits(partition, torch.optim.AdamW, plan.partitioner.value, plan.classes)
    sharded = plan.memory(plan.partitioner.value)
    assert len(sharded.ranks) == 2 and sum(r.state_bytes for r in sharded.ranks) >= whole


def test_with_overlap_the_specs_carry_the_buckets_ddp_will_make_last_layers_first():
    cfg, _, _ = compose_job(["optim=zero_adam", "overlap=true", "dist.bucket_cap_mb=0.0001"])
    specs = RunPlan.of(cfg).specs
    buckets = [s.bucket for s in specs]
    assert None not in buckets and len(set(buckets)) > 1
    assert buckets[-1] == 0 and buckets[0] == max(buckets)  # DDP numbers its buckets from the last layer
    plain, _, _ = compose_job(["optim=zero_adam"])
    assert {s.bucket for s in RunPlan.of(plain).specs} == {None}


def test_a_model_that_cannot_be_built_is_kept_with_its_error_and_named_once():
    cfg, _, _ = compose_job(["model.activation=swish"])
    plan = RunPlan.of(cfg)
    assert isinstance(plan.model.error, ValueError) and plan.model.value is None
    assert plan.specs is None and plan.groups.value is None
    message = problems("model.activation=swish")
    assert message.count("cannot be built") == 1
    assert "model=mlp: cannot be built: model.activation=swish: MLP refuses it: activation must be one of" in message


class WithAux(MLP):
    """The shipped MLP and a layer (``aux``) its forward never uses: it never gets a gradient."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.aux = torch.nn.Linear(3, 5)


def test_the_plan_finds_the_parameters_no_gradient_reaches_on_its_own_meta_model_once():
    aux = [f"model._target_={__name__}.WithAux", "dist.find_unused_parameters=true"]
    cfg, _, _ = compose_job([*aux, "optim=zero_adam", "dist.world_size=2"])
    plan = RunPlan.of(cfg)
    plan.release_data()  # what needs the data is answered before the data source goes
    assert "data" not in vars(plan)
    assert plan.never_reached == ("aux.weight", "aux.bias")
    assert all(p.grad is None for p in plan.model.value.parameters())  # the meta model left as the checks read it
    assert [s.name for s in plan.specs][-2:] == ["aux.weight", "aux.bias"]  # the specs the ranks price "÷ DDP" from
    for overrides in ([*aux, "optim=adam"], [*aux, "optim=zero_adam", "overlap=true"], ["optim=zero_adam"]):
        assert RunPlan.of(compose_job(overrides)[0]).never_reached is None, overrides  # nothing to probe


class CountingAux(WithAux):
    """:class:`WithAux`, counting its forwards (each one a probe of its meta model)."""

    forwards: ClassVar[int] = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CountingAux.forwards += 1
        return super().forward(x)


def test_a_checked_zero_job_with_unused_parameters_probes_its_meta_model_once():
    CountingAux.forwards = 0
    overrides = [f"model._target_={__name__}.CountingAux", "dist.find_unused_parameters=true", "optim=zero_adam"]
    cfg, hydra = preflight([*overrides, "dist.world_size=2"])  # the forward check reads the plan's probe
    plan = check_unless_checked(cfg, hydra, None)  # the task's plan: the check's, its data let go
    assert plan.never_reached == ("aux.weight", "aux.bias")  # read from that same probe
    assert CountingAux.forwards == 1
