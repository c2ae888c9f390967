"""The planned peak's terms (zero_lab.peak) against figures computed by hand for 12 × Linear(768),
batch 16, W=2 — the model of scripts/bench_memory.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zero_lab.engine.layout import plan_buckets
from zero_lab.partition import Flat, SortedGreedy
from zero_lab.peak import engine_peak, peak_of_plan, saved_activation_bytes, step_workspace_ratio
from zero_lab.planner import plan_memory, specs_from_module

LAYERS, WIDTH, BATCH, W = 12, 768, 16, 2
WEIGHT = WIDTH * WIDTH * 4  # one layer's weight, fp32: the largest parameter
LAYER = (WIDTH * WIDTH + WIDTH) * 4  # weight + bias: one engine bucket at the 4 MiB cap
PSI = LAYERS * LAYER
ACTIVATIONS = (LAYERS + 1) * BATCH * WIDTH * 4  # each Linear's input, and pow's input (the last output)


def meta_model() -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))), torch.empty(BATCH, WIDTH)


def test_activations_are_the_saved_inputs_of_every_layer_and_the_loss_not_the_parameters():
    model, x = meta_model()
    assert saved_activation_bytes(lambda: model(x).pow(2).mean(), model.parameters()) == ACTIVATIONS


@pytest.mark.parametrize(
    ("optimizer_class", "defaults", "ratio"),
    [
        (torch.optim.Adam, {}, 2.0),  # exp_avg_sq.sqrt() and its quotient by the bias correction
        (torch.optim.AdamW, {}, 2.0),
        (torch.optim.SGD, {"momentum": 0.9}, 0.0),  # every op in place on the momentum and the parameter
    ],
)
def test_step_workspace_is_the_temporaries_of_one_step(optimizer_class, defaults, ratio):
    assert step_workspace_ratio(optimizer_class, **defaults) == ratio


def test_ddp_peak_is_the_held_tensors_plus_the_larger_phase():
    model, _ = meta_model()
    specs = specs_from_module(model)
    (rank0, rank1) = peak_of_plan(plan_memory(specs, W, None), specs, ACTIVATIONS)
    assert rank0 == rank1
    assert rank0.held == PSI + PSI + 2 * PSI + LAYERS * 2 * 4  # grads, buckets, Adam's moments + step scalars
    assert (rank0.produced_grad, rank0.receive, rank0.step_workspace) == (WEIGHT, 0, 2 * WEIGHT)
    assert rank0.total == rank0.held + 2 * WEIGHT  # the step's temporaries outweigh activations + one gradient


def test_zero1_on_ddp_steps_the_largest_owned_parameter():
    model, _ = meta_model()
    specs = specs_from_module(model)
    plans = peak_of_plan(plan_memory(specs, W, SortedGreedy()), specs, ACTIVATIONS)
    for plan in plans:
        assert plan.step_workspace == 2 * WEIGHT  # six weights each
        assert plan.held == PSI + PSI + PSI + LAYERS * 4  # grads, buckets, half of the moments, 12 step scalars


def test_engine_peak_adds_the_receive_buffers_and_the_gradient_being_produced():
    model, _ = meta_model()
    specs = specs_from_module(model)
    buckets = plan_buckets(specs, W, Flat(), 4.0)
    assert [b.nbytes for b in buckets] == [LAYER] * LAYERS
    plans = engine_peak(plan_memory(specs, W, Flat()), specs, buckets, ACTIVATIONS)
    owned = LAYER // W
    for plan in plans:
        state = LAYERS * (2 * owned + 4)  # moments of the owned range of every bucket, a step scalar each
        assert plan.held == state + LAYERS * owned + 2 * LAYER  # + owned gradients + two bucket buffers
        assert (plan.receive, plan.produced_grad, plan.step_workspace) == (2 * owned, WEIGHT, 2 * owned)
        assert plan.total == plan.backward_peak == plan.held + ACTIVATIONS + WEIGHT + 2 * owned
    control = engine_peak(plan_memory(specs, W, Flat()), specs, buckets, ACTIVATIONS, grad_reduce="all_reduce")
    assert control[0].receive == 0


def test_engine_over_shared_memory_holds_its_mailbox_and_the_peers_slots_it_reads_but_no_receive_buffer():
    model, _ = meta_model()
    specs = specs_from_module(model)
    buckets = plan_buckets(specs, W, Flat(), 4.0)
    p2p = engine_peak(plan_memory(specs, W, Flat()), specs, buckets, ACTIVATIONS)
    shm = engine_peak(plan_memory(specs, W, Flat()), specs, buckets, ACTIVATIONS, grad_reduce="shm_reduce_scatter")
    # a slot holds half a layer (the peer's segment, or this rank's range: one message each), 64-byte aligned,
    # with 72 bytes of room per rank for the pieces' alignment; four slots and the counters' 4 KiB page
    slot = -(-(LAYER // W) // 64) * 64 + W * 72
    mailbox = 4096 + 4 * -(-slot // 64) * 64
    for old, new in zip(p2p, shm):
        assert new.held == old.held + 2 * mailbox  # its own, and the peer's that it reads (W=2)
        assert (new.receive, new.step_workspace) == (0, old.step_workspace)


def test_engine_peak_refuses_a_reduction_it_does_not_know():
    model, _ = meta_model()
    specs = specs_from_module(model)
    with pytest.raises(ValueError, match="grad_reduce='reduce_scatter_native'"):
        engine_peak(
            plan_memory(specs, W, Flat()), specs, plan_buckets(specs, W, Flat(), 4.0), 0, "reduce_scatter_native"
        )
