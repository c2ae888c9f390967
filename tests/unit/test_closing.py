"""The closing lines (zero_lab/app/record/closing.py) from a RunSummary: what ran is said (validation,
resume, accumulation, the local step that Muon and cost models change), the baseline is named
plainly, and a saving above the world size cannot be printed; the baseline itself
(zero_lab/app/run/memory.py) prices only the parameters that get state, as DDP + the optimizer would."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from zero_lab import Flat, SortedGreedy, ZeroRedundancyOptimizer
from zero_lab.app.plan.strategy import Strategy
from zero_lab.app.record.closing import closing_lines
from zero_lab.app.record.summary import RunSummary
from zero_lab.app.run.memory import ddp_state_bytes, optimizer_classes
from zero_lab.measure import optimizer_state_bytes
from zero_lab.planner import specs_from_module

KIB = 1024
RUN_DIR = Path("/runs/r")


def summary(**changes: object) -> RunSummary:
    """A ZeRO-Adam run at W=2 that ran 4 steps, nothing optional."""
    values: dict[str, object] = {
        "final_loss": 0.25,
        "losses": [1.0, 0.75, 0.5, 0.25],
        "world_size": 2,
        "steps": 4,
        "zero": True,
        "optim_state_bytes": [50.0 * KIB, 48.0 * KIB],
        "ddp_state_bytes": 98 * KIB,
        "optimizer_classes": ["Adam"],
        "elementwise": True,
        "imbalance": 1.02,
        "step_time_s": 0.02,
        "exchange_time_s": 0.005,
        "exchange_bytes_per_step": 4096.0,
        "optim_step_s": [0.004, 0.006],
        "optim_step_max_over_mean": 1.2,
        "partition": {"imbalance": 1.02, "cost": "numel"},
    }
    return RunSummary(**(values | changes))  # type: ignore[arg-type]


def lines(**changes: object) -> list[str]:
    return closing_lines(summary(**changes), "Adam", RUN_DIR, 3.0)


def test_a_plain_zero_run_ends_with_loss_state_exchange_and_run_dir_only():
    assert lines() == [
        "zero_lab: final loss 0.25 after 4 steps on 2 rank(s) (3.0 s)",
        "  optimizer state per rank: 50.00 KiB on the fullest of 2 rank(s) (imbalance 1.02); "
        "DDP + the same Adam would hold 98.00 KiB on every rank (planner): ÷ 1.96",
        "  parameter exchange: 25% of the step (median 5.0 of 20.0 ms), 4.00 KiB of parameters exchanged per step "
        "(the model's)",
        "  data parallel: torch's DDP, then ZeRO steps each rank's shard (dp=ddp)",
        "  run dir: /runs/r",
    ]


def test_the_data_parallel_line_says_which_path_dp_auto_took_and_why():
    why = "dp=auto: overlap=true only the DDP path takes"
    chose = {"dp": "ddp", "requested": "auto", "reason": why}
    assert lines(dp_choice=chose, overlap=True, bucket_view=True)[-2] == (
        f"  data parallel: torch's DDP, then ZeRO steps each rank's shard ({why}): bucket_view=true"
    )
    plain = {"dp": "ddp", "requested": "auto", "reason": "dp=auto: a plain Adam, its whole state on every rank"}
    assert lines(zero=False, dp_choice=plain)[-2] == (
        "  data parallel: torch's DDP (dp=auto: a plain Adam, its whole state on every rank)"
    )
    modes = {"grad_reduce": "reduce_scatter", "exchange": "p2p_all_gather", "prefetch": False, "buckets": 1,
             "bucket_cap_mb": 4.0, "partitioner": "Flat()", "peak_grad_bytes": 3 * KIB,
             "grad_hold_bound": 5 * KIB}  # fmt: skip
    engine = {"dp": "zero_lab", "requested": "auto", "reason": "dp=auto: a sharded Adam and no key only DDP takes"}
    shown = lines(dp="zero_lab", engine=modes, dp_choice=engine)
    assert shown[-3:-1] == [
        "  data parallel: zero_lab.ShardedDataParallel (dp=auto: a sharded Adam and no key only DDP takes): "
        "grad_reduce=reduce_scatter, exchange=p2p_all_gather, prefetch=false, 1 bucket(s) of at most 4.0 MiB, "
        "partitioner Flat()",
        "  gradients held on rank 0: 3.00 KiB at most, measured (bound: owned + two buckets = 5.00 KiB)",
    ]
    asked = lines(dp="zero_lab", engine=modes, dp_choice={**engine, "requested": "zero_lab"})
    assert asked[-3].startswith("  data parallel: zero_lab.ShardedDataParallel (dp=zero_lab): grad_reduce=")
    refused = "host shared memory refused, over Gloo: host_shm: ranks 0 and 1 of the group are on different hosts"
    fell_back = lines(dp="zero_lab", engine={**modes, "transport_note": refused}, dp_choice=engine)
    assert fell_back[-3].endswith(f"partitioner Flat(); {refused}")


def test_validation_resume_and_accumulation_are_said_when_they_ran():
    shown = lines(
        final_val_loss=0.3125,
        best_val_loss=0.296875,
        eval_every=2,
        eval_batches=3,
        accumulate=4,
        start_step=2,
        resumed_from="/runs/first",
        resumed_checkpoint="/runs/first/checkpoints/step_00000002",
        resume_optimizer="strict",
    )
    assert shown[1:4] == [
        "  resumed from /runs/first/checkpoints/step_00000002 at step 2 (resume_optimizer=strict)",
        "  accumulate=4: each step summed 4 micro-batches per rank",
        "  validation loss: final 0.3125, best 0.296875 (eval_every=2, 3 batches each)",
    ]
    assert shown[0] == "zero_lab: final loss 0.25 after 4 steps on 2 rank(s) (3.0 s)"  # all steps, resumed ones too


def test_muon_names_its_classes_and_shows_the_local_step_per_rank():
    muon = lines(optimizer_classes=["Muon", "AdamW"], elementwise=False)
    assert "DDP + the same Muon/AdamW would hold 98.00 KiB on every rank (planner): ÷ 1.96" in muon[1]
    assert (
        muon[2]
        == "  optimizer step per rank: 4.0 / 6.0 ms (median per rank), slowest ÷ mean 1.20 (partitioner.cost=numel)"
    )
    by_cost = lines(optimizer_classes=["Muon", "AdamW"], elementwise=False, partition={"cost": "newton_schulz"})
    assert by_cost[2].endswith("slowest ÷ mean 1.20 (partitioner.cost=newton_schulz)")
    ddp_muon = lines(zero=False, partition=None, optimizer_classes=["Muon", "AdamW"], elementwise=False)
    assert (
        ddp_muon[1] == "  optimizer state per rank: 50.00 KiB, all of it on every rank "
        "(DDP + Muon/AdamW; a zero_* optimizer shards it)"
    )
    assert ddp_muon[2] == "  optimizer step per rank: 4.0 / 6.0 ms (median per rank), slowest ÷ mean 1.20"


def test_a_cost_model_shows_the_local_step_and_numel_adam_does_not():
    assert not any("optimizer step per rank" in line for line in lines())
    assert lines(partition={"cost": "newton_schulz"})[2].startswith("  optimizer step per rank: 4.0 / 6.0 ms")
    many = lines(world_size=16, optim_state_bytes=[8.0 * KIB] * 16, optim_step_s=[0.001 * (r + 1) for r in range(16)],
                 partition={"cost": "newton_schulz"}, ddp_state_bytes=98 * KIB)  # fmt: skip
    assert many[2] == (
        "  optimizer step per rank: 1.0 … 16.0 ms (medians of 16 ranks), slowest ÷ mean 1.20 "
        "(partitioner.cost=newton_schulz)"
    )


def test_local_steps_of_a_second_or_more_are_shown_in_seconds():
    slow = lines(optimizer_classes=["Muon", "AdamW"], elementwise=False, optim_step_s=[20.77, 22.22])
    assert slow[2].startswith("  optimizer step per rank: 20.8 / 22.2 s (median per rank), slowest ÷ mean 1.20")


def test_a_summary_without_class_names_falls_back_to_the_plan_name():
    assert "DDP + the same Adam would hold" in lines(optimizer_classes=None)[1]


def test_a_saving_above_the_world_size_is_never_printed():
    # the own-model case of issue 30: rank 1 holds everything, the baseline priced a layer that never got state
    with pytest.raises(AssertionError, match="a saving above the world size cannot be"):
        lines(optim_state_bytes=[0.0, 43.09 * KIB], ddp_state_bytes=172 * KIB)
    exactly_w = lines(optim_state_bytes=[49.0 * KIB, 49.0 * KIB])
    assert exactly_w[1].endswith("÷ 2.00")


class WithUnused(nn.Module):
    """Two layers in the forward and one (``aux``) never used: it gets no gradient, so no state."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out, self.aux = nn.Linear(6, 16), nn.Linear(16, 2), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x)))


def _stepped(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    optimizer.zero_grad()
    model(torch.randn(4, 6, generator=torch.Generator().manual_seed(1))).pow(2).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("partitioner", [None, SortedGreedy(), Flat()])
def test_the_ddp_baseline_prices_only_the_parameters_that_get_state(single_rank_group, partitioner):
    model = WithUnused()
    if partitioner is None:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-3)
    _stepped(optimizer, model)
    held = Strategy.of_optimizer(optimizer).params_with_state(optimizer)
    assert held == [True, True, True, True, False, False]  # inp, out: weight and bias; aux: none
    measured = optimizer_state_bytes(optimizer)
    specs = specs_from_module(model)  # what the run plan's specs are for this model
    assert ddp_state_bytes(specs, optimizer, held) == measured  # like with like: exactly what DDP + Adam holds
    assert ddp_state_bytes(specs, optimizer) > measured  # the whole model would price aux's state too
    with pytest.raises(ValueError, match="specs: 5 for the optimizer's 6 parameters; pass the run plan's"):
        ddp_state_bytes(specs[:5], optimizer, held)
    assert optimizer_classes(optimizer) == [torch.optim.Adam]


def test_exchange_auto_names_its_choice_and_a_near_tie_kept_by_preference():
    exchange_line = (
        "  parameter exchange: 25% of the step (median 5.0 of 20.0 ms), 4.00 KiB of parameters exchanged per step "
    )
    tie = {"requested": "auto", "collective": "broadcast", "within_noise": ["p2p_all_gather"]}
    assert lines(exchange=tie)[2] == (
        exchange_line + "(the model's); exchange=auto chose broadcast; p2p_all_gather within the noise of it, "
        "the preferred one kept"
    )
    clear = {"requested": "auto", "collective": "p2p_all_gather", "within_noise": []}
    assert lines(exchange=clear)[2] == exchange_line + "(the model's); exchange=auto chose p2p_all_gather"
    named = {"requested": "broadcast", "collective": "broadcast", "within_noise": []}
    assert lines(exchange=named)[2] == exchange_line + "(the model's)"
