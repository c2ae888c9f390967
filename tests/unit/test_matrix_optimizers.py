"""Matrix optimizers beside elementwise ones: routing, the elementwise declaration, chained
groups and their state dicts, and a one-rank ZeroRedundancyOptimizer with several classes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zero_lab
from tests.preflight import preflight
from zero_lab import (
    ChainedOptimizer,
    Flat,
    SortedGreedy,
    ZeroRedundancyOptimizer,
    is_elementwise,
    merge_state_dicts,
    muon_param_groups,
    register_elementwise,
    split_state_dict,
)
from zero_lab.app.check.rules import ConfigError
from zero_lab.app.run import checkpoints as app_checkpoint
from zero_lab.app.workloads.models import TinyLM
from zero_lab.measure import optimizer_state_bytes
from zero_lab.planner import plan_memory, whole_state_bytes


def lm(tied: bool = False, seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(vocab_size=50, seq_len=8, d_model=16, n_layer=2, n_head=2)
    if tied:
        model.head.weight = model.tok_emb.weight
    return model


HIDDEN = [f"blocks.{i}.{m}.weight" for i in range(2) for m in ("qkv", "proj", "fc", "out")]


@pytest.mark.parametrize("tied", [False, True])
def test_routing_sends_hidden_matrices_to_muon_and_the_rest_to_adamw(tied):
    model = lm(tied)
    muon, rest = muon_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 3e-4})
    assert muon["optimizer_class"] is torch.optim.Muon and muon["lr"] == 0.02
    assert [n for n, _ in muon["params"]] == HIDDEN
    names = [n for n, _ in rest["params"]]
    assert "optimizer_class" not in rest and rest["lr"] == 3e-4
    assert "tok_emb.weight" in names and "pos_emb.weight" in names and "ln_f.weight" in names
    assert ("head.weight" in names) is (not tied)  # tied: the head *is* tok_emb.weight, listed once
    assert all(p.dim() == 2 for _, p in muon["params"])
    assert len(muon["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_routing_finds_an_untied_head_by_shape_and_obeys_globs():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.mix = nn.Linear(4, 4)
            self.proj_out = nn.Linear(4, 10, bias=False)  # no head-like name: found by the table's shape

    muon, rest = muon_param_groups(Net())
    assert [n for n, _ in muon["params"]] == ["mix.weight"]
    assert [n for n, _ in rest["params"]] == ["emb.weight", "mix.bias", "proj_out.weight"]
    forced = muon_param_groups(Net(), to_muon=["proj_out.*", "mix.bias"], to_adamw=["mix.*"])
    assert [n for n, _ in forced[0]["params"]] == ["proj_out.weight"]  # mix.bias is 1-D: never Muon
    assert len(muon_param_groups(nn.Linear(3, 1, bias=True).requires_grad_(), to_adamw=["*"])) == 1


def test_elementwise_declaration():
    class Sign(torch.optim.Optimizer):  # a third-party elementwise optimizer
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

    class Declared(Sign):
        elementwise = True

    class MixingAdam(torch.optim.Adam):
        elementwise = False  # honoured before the registry's Adam entry

    assert is_elementwise(torch.optim.AdamW) and not is_elementwise(torch.optim.Muon)
    assert not is_elementwise(torch.optim.Adafactor) and not is_elementwise(MixingAdam)
    assert is_elementwise(Declared) and not is_elementwise(Sign)
    assert register_elementwise(Sign) is Sign and is_elementwise(Sign)
    assert torch.optim.Adam in zero_lab.ELEMENTWISE_OPTIMIZERS
    from zero_lab.optimizer import ELEMENTWISE_OPTIMIZERS  # the old import path still works

    assert ELEMENTWISE_OPTIMIZERS is zero_lab.ELEMENTWISE_OPTIMIZERS
    with pytest.raises(TypeError, match="Optimizer subclass"):
        register_elementwise(int)


def test_flat_takes_a_registered_optimizer_and_refuses_a_matrix_one(single_rank_group):
    class Sign(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.data.add_(p.grad.sign(), alpha=-group["lr"])

    with pytest.raises(ValueError, match="elementwise optimizer"):
        ZeroRedundancyOptimizer([nn.Parameter(torch.ones(4))], Sign, partitioner=Flat())
    register_elementwise(Sign)
    ZeroRedundancyOptimizer([nn.Parameter(torch.ones(4))], Sign, partitioner=Flat())
    refused = r"parameter 'blocks.0.qkv.weight' \(shape \(48, 16\), group 0\).*Muon is not one"
    with pytest.raises(ValueError, match=refused):
        ZeroRedundancyOptimizer(muon_param_groups(lm()), torch.optim.AdamW, partitioner=Flat())


def _train(model: nn.Module, optimizers: list[torch.optim.Optimizer], steps: int = 3) -> None:
    tokens = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        for opt in optimizers:
            opt.zero_grad()
        model(tokens).logsumexp(-1).mean().backward()
        for opt in optimizers:
            opt.step()


def plain_chain(model: nn.Module) -> list[torch.optim.Optimizer]:
    """torch's own Muon + AdamW on the routed groups."""
    muon, rest = muon_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 3e-3})
    return [torch.optim.Muon(muon["params"], lr=0.02), torch.optim.AdamW(rest["params"], lr=3e-3, weight_decay=0.05)]


def test_chained_optimizer_is_the_plain_chain_and_its_state_dict_splits_into_it():
    ours, theirs = lm(), lm()
    chained = ChainedOptimizer(
        muon_param_groups(ours, muon={"lr": 0.02}, adamw={"lr": 3e-3}), torch.optim.AdamW, weight_decay=0.05
    )
    plain = plain_chain(theirs)
    _train(ours, [chained])
    _train(theirs, plain)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    assert [type(o) for o in chained.optimizers] == [torch.optim.Muon, torch.optim.AdamW]
    assert len(chained.state) == len(list(ours.parameters()))
    saved = chained.state_dict()
    assert [g["optimizer_class"] for g in saved["param_groups"]] == ["torch.optim.Muon", "torch.optim.AdamW"]
    parts = split_state_dict(saved)
    for opt, part in zip(plain, parts):
        assert opt.state_dict()["param_groups"][0]["params"] == part["param_groups"][0]["params"]
        for key, value in opt.state_dict()["state"].items():
            assert all(torch.equal(value[k], part["state"][key][k]) for k in value if torch.is_tensor(value[k]))
    merged = merge_state_dicts([o.state_dict() for o in plain], chained.group_classes())
    assert merged["param_groups"] == saved["param_groups"]
    scheduler = torch.optim.lr_scheduler.StepLR(chained, step_size=1, gamma=0.5)
    chained.step()
    scheduler.step()
    assert chained.optimizers[0].param_groups[0]["lr"] == 0.01  # the scheduler reaches the inner optimizers
    chained.load_state_dict(saved)
    assert chained.optimizers[0].param_groups[0]["lr"] == 0.02 and chained.param_groups[0]["lr"] == 0.02
    with pytest.raises(ValueError, match=r"saved for torch\.optim\.AdamW but is stepped by torch\.optim\.Muon"):
        chained.load_state_dict({**saved, "param_groups": saved["param_groups"][::-1]})


def test_one_rank_zero_with_muon_and_adamw(single_rank_group):
    ours, theirs = lm(), lm()
    zero = ZeroRedundancyOptimizer(
        muon_param_groups(ours, muon={"lr": 0.02}, adamw={"lr": 3e-3}),
        torch.optim.AdamW,
        partitioner=SortedGreedy(cost="newton_schulz"),
        weight_decay=0.05,
    )
    assert zero.param_groups[0]["momentum"] == 0.95 and "betas" not in zero.param_groups[0]  # Muon's defaults
    assert zero.param_groups[1]["betas"] == (0.9, 0.999) and zero.param_groups[1]["weight_decay"] == 0.05
    assert isinstance(zero.optim, ChainedOptimizer) and zero.group_classes() == [torch.optim.Muon, torch.optim.AdamW]
    plain = plain_chain(theirs)
    _train(ours, [zero])
    _train(theirs, plain)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    zero.consolidate_state_dict(0)
    full = zero.state_dict()
    assert [g["optimizer_class"] for g in full["param_groups"]] == ["torch.optim.Muon", "torch.optim.AdamW"]
    for opt, part in zip(plain, split_state_dict(full)):
        opt.load_state_dict(part)
    zero.load_state_dict([o.state_dict() for o in plain])  # and back, from the plain optimizers
    with pytest.raises(ValueError, match="refused by Muon: Muon only supports 2D parameters"):
        norms = {"params": [ours.ln_f.weight], "optimizer_class": torch.optim.Muon}
        ZeroRedundancyOptimizer([norms], torch.optim.AdamW)


def test_single_class_keeps_torch_api_and_a_new_class_can_be_added(single_rank_group):
    model = lm()
    muon, rest = muon_param_groups(model)
    zero = ZeroRedundancyOptimizer(rest["params"], torch.optim.AdamW, lr=1e-3)
    assert type(zero.optim) is torch.optim.AdamW
    zero.add_param_group({"params": muon["params"], "optimizer_class": torch.optim.Muon, "lr": 0.02})
    assert isinstance(zero.optim, ChainedOptimizer)
    assert [type(o) for o in zero.optim.optimizers] == [torch.optim.AdamW, torch.optim.Muon]
    _train(model, [zero], steps=1)
    assert all("momentum_buffer" in zero.optim.state[p] for _, p in muon["params"])


def test_planner_prices_muon_and_adafactor_at_their_shapes(single_rank_group):
    """The planner's state bytes equal the one-rank ZeRO's real state after a step, to the byte."""
    for matrix_class in (torch.optim.Muon, torch.optim.Adafactor):
        model = lm()
        groups = muon_param_groups(model, muon_class=matrix_class)
        zero = ZeroRedundancyOptimizer(groups, torch.optim.AdamW, partitioner=SortedGreedy(cost="newton_schulz"))
        _train(model, [zero], steps=1)
        specs = zero._param_specs()
        per_group = [(matrix_class, {}), (torch.optim.AdamW, {})]
        plan = plan_memory(specs, 1, SortedGreedy(cost="newton_schulz"), torch.optim.AdamW, group_optimizers=per_group)
        assert plan.ranks[0].state_bytes == optimizer_state_bytes(zero), matrix_class
    assert whole_state_bytes(torch.optim.Muon, (64, 16)) == 64 * 16 * 4  # momentum_buffer
    assert whole_state_bytes(torch.optim.Adafactor, (64, 16)) == (64 + 16) * 4 + 4  # row + column factors + step


def test_the_app_checks_muon_configs_on_the_real_shapes():
    preflight(["optim=zero_muon", "model=transformer", "data=tokens", "partitioner.cost=newton_schulz"])
    preflight(["experiment=muon_lm", "optim=muon"])
    refused = r"param group 0 \(\d+ parameter\(s\), first 'layers.0.weight'\) is refused by Muon: Learning rate"
    with pytest.raises(ConfigError, match=refused):
        preflight(["optim=zero_muon", "optim.param_groups.muon.lr=-1"])
    with pytest.raises(ConfigError, match=r"partitioner=flat .*Flat cuts parameter 'layers.0.weight'.*Muon is not one"):
        preflight(["optim=zero_muon", "partitioner=flat"])
    with pytest.raises(ConfigError, match=r"cost='flops' is not one of"):
        preflight(["optim=zero_muon", "partitioner.cost=flops"])


def test_master_weights_with_muon_and_adamw(single_rank_group):
    """bf16 parameters, fp32 masters: each class steps its fp32 shards; equal to the plain chain on fp32 copies."""
    model = lm().to(torch.bfloat16)
    zero = ZeroRedundancyOptimizer(
        muon_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 3e-3}),
        torch.optim.AdamW,
        master_weights=True,
        weight_decay=0.05,
    )
    masters = lm()  # the same initial weights in fp32, rounded like the bf16 model
    with torch.no_grad():
        for fp32, bf16 in zip(masters.parameters(), model.parameters()):
            fp32.copy_(bf16.float())
    plain = plain_chain(masters)
    tokens = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        zero.zero_grad()
        for opt in plain:
            opt.zero_grad()
        model(tokens).float().logsumexp(-1).mean().backward()
        for fp32, bf16 in zip(masters.parameters(), model.parameters()):
            fp32.grad = bf16.grad.float()  # the masters step on the bf16 model's gradients
        zero.step()
        for opt in plain:
            opt.step()
    assert {p.dtype for o in zero.optim.optimizers for g in o.param_groups for p in g["params"]} == {torch.float32}
    assert zero.master_weight_bytes() == 4 * sum(p.numel() for p in model.parameters())
    for fp32, bf16 in zip(masters.parameters(), model.parameters()):
        assert torch.equal(fp32.to(torch.bfloat16), bf16)  # the rounded masters are the parameters, bitwise


def test_app_resume_compares_a_chains_hyperparameters_without_its_class_names():
    """A plain chain's state dict names each group's class; its live groups do not: not a difference."""
    chained = ChainedOptimizer(muon_param_groups(lm()), torch.optim.AdamW, lr=1e-3)
    saved = chained.state_dict()["param_groups"]
    mine = app_checkpoint._hyperparameters(chained.param_groups)
    assert app_checkpoint._differences(saved, mine) == {}
    mine[0]["lr"] = 0.5
    assert app_checkpoint._differences(saved, mine) == {"group0.lr": [1e-3, 0.5]}
