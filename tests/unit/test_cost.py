"""Cost-balanced partitions: the cost model, LPT at simulated W up to 1024, the report."""

from __future__ import annotations

import pytest
import torch

from zero_lab.partition import (
    DdpBucket,
    Flat,
    Manual,
    ParamSpec,
    SortedGreedy,
    newton_schulz_cost,
    numel_cost,
    resolve_cost,
)

A = (256, 256)  # 16,777,216 Newton–Schulz units
B = (32, 2048)  # same numel, 2,097,152 units


def matrix(shape: tuple[int, int], name: str = "w", elementwise: bool = False, group: int = 0) -> ParamSpec:
    return ParamSpec(numel=shape[0] * shape[1], shape=shape, name=name, elementwise=elementwise, group=group)


def llama_specs(layers: int = 32) -> list[ParamSpec]:
    """Llama-3-8B's shapes (GQA K/V, wide MLP): matrices to Muon, norms, embedding and head elementwise."""
    d, kv, ffn, vocab = 4096, 1024, 14336, 128256
    specs = [ParamSpec(numel=vocab * d, shape=(vocab, d), name="tok_embeddings.weight")]
    for i in range(layers):
        for name, shape in (("wq", (d, d)), ("wk", (kv, d)), ("wv", (kv, d)), ("wo", (d, d))):
            specs.append(matrix(shape, f"layers.{i}.attention.{name}.weight"))
        for name, shape in (("w1", (ffn, d)), ("w3", (ffn, d)), ("w2", (d, ffn))):
            specs.append(matrix(shape, f"layers.{i}.feed_forward.{name}.weight"))
        specs += [ParamSpec(numel=d, name=f"layers.{i}.{n}_norm.weight") for n in ("attention", "ffn")]
    specs.append(ParamSpec(numel=vocab * d, shape=(vocab, d), name="output.weight"))
    return specs


def mixed_specs(layers: int = 7) -> list[ParamSpec]:
    """Aspect ratios that differ a lot: square attention, GQA K/V, 4:1 MLP, 5 narrow MoE-like experts."""
    specs = []
    for i in range(layers):
        specs += [matrix((1024, 1024), f"l{i}.q"), matrix((256, 1024), f"l{i}.kv")]
        specs += [matrix((4096, 1024), f"l{i}.up"), matrix((1024, 4096), f"l{i}.down")]
        specs += [matrix((64, 4096), f"l{i}.expert{e}") for e in range(5)]
        specs.append(ParamSpec(numel=1024, name=f"l{i}.norm"))
    return specs


def test_the_costs():
    assert numel_cost(matrix(B)) == 65_536
    assert newton_schulz_cost(matrix(A)) == 16_777_216
    assert newton_schulz_cost(matrix(B)) == 2048 * 32**2 == 2_097_152
    assert newton_schulz_cost(matrix(B, elementwise=True)) == 65_536  # AdamW on a matrix: linear in numel
    assert newton_schulz_cost(ParamSpec(numel=7)) == 7  # not 2-D
    assert resolve_cost(None) is numel_cost and resolve_cost("newton_schulz") is newton_schulz_cost
    assert resolve_cost(len) is len
    with pytest.raises(ValueError, match=r"cost='flops' is not one of \['newton_schulz', 'numel'\]"):
        SortedGreedy(cost="flops")
    with pytest.raises(ValueError, match="does not hold numel=6"):
        ParamSpec(numel=6, shape=(2, 2))


def test_numel_balance_puts_the_expensive_matrices_on_one_rank_and_cost_balance_does_not():
    """The issue's measurement: 8 Muon matrices of equal numel, interleaved shapes, W=2."""
    specs = [matrix(A if i % 2 == 0 else B, f"w{i}") for i in range(8)]
    by_numel = SortedGreedy()(specs, 2)
    assert by_numel.owners() == [0, 1, 0, 1, 0, 1, 0, 1]
    report = by_numel.report(cost="newton_schulz")
    assert report.cost_per_rank == (67_108_864, 8_388_608)
    assert report.imbalance == 1.0 and report.cost_imbalance == pytest.approx(67_108_864 / 37_748_736)
    by_cost = SortedGreedy(cost="newton_schulz")(specs, 2)
    assert by_cost.report().cost_per_rank == (37_748_736, 37_748_736)
    assert by_cost.report().cost == "newton_schulz" and by_cost.report().cost_imbalance == 1.0
    assert by_cost.owners() == [0, 0, 1, 1, 0, 0, 1, 1]  # A, A to ranks 0, 1, then B, B likewise
    assert "cost (newton_schulz)" in str(by_cost.report())
    assert by_cost.report().as_dict()["cost_per_rank"] == [37_748_736, 37_748_736]


@pytest.mark.parametrize("world_size", [2, 8, 64, 256, 1024])
@pytest.mark.parametrize("specs_of", [llama_specs, mixed_specs])
def test_lpt_by_cost_at_scale(specs_of, world_size):
    """LPT's guarantee (max ≤ mean + largest job) holds for the cost, and it is never worse than numel's."""
    specs = specs_of()
    by_cost = SortedGreedy(cost="newton_schulz")(specs, world_size)
    by_numel = SortedGreedy()(specs, world_size)
    costs = [newton_schulz_cost(s) for s in specs]
    loads = by_cost.report().cost_per_rank
    assert sum(loads) == sum(costs)
    assert max(loads) <= sum(costs) / world_size + max(costs)
    assert max(loads) >= max(costs)
    assert by_cost.report().cost_imbalance <= by_numel.report(cost="newton_schulz").cost_imbalance + 1e-12
    assert by_cost.is_whole and sorted({s.param for s in by_cost.shards}) == list(range(len(specs)))


def test_lpt_figures_on_real_shapes():
    """Exact figures, so a change of the algorithm shows: Llama-3-8B at W=8 and the mixed model at W=4.
    Balancing the cost costs memory balance (the embedding and head are cheap per element)."""
    llama = llama_specs()
    assert round(SortedGreedy()(llama, 8).report(cost="newton_schulz").cost_imbalance, 4) == 1.1584
    by_cost = SortedGreedy(cost="newton_schulz")(llama, 8).report()
    assert (round(by_cost.cost_imbalance, 4), round(by_cost.imbalance, 4)) == (1.0001, 1.3925)
    mixed = mixed_specs()
    assert round(SortedGreedy()(mixed, 4).report(cost="newton_schulz").cost_imbalance, 4) == 1.0188
    assert round(SortedGreedy(cost="newton_schulz")(mixed, 4).report().cost_imbalance, 4) == 1.0002


def test_manual_order_and_ddp_bucket_balance_the_cost():
    specs = [matrix(A if i < 4 else B, f"w{i}") for i in range(8)]
    order = Manual(order=["w*"], cost="newton_schulz")(specs, 2)
    assert order.owners() == [0, 0, 1, 1, 1, 1, 1, 1]  # 2A | 2A + 4B: the contiguous cut with the smallest max
    assert Manual(order=["w*"])(specs, 2).owners() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert repr(Manual(order=["w*"], cost="newton_schulz")) == "Manual(order=['w*'], cost='newton_schulz')"
    bucketed = [ParamSpec(**{**s.__dict__, "bucket": i // 2}) for i, s in enumerate(specs)]
    whole = DdpBucket(cost="newton_schulz")(bucketed, 2)
    assert whole.owners() == [0, 0, 1, 1, 0, 0, 1, 1]
    split = DdpBucket(shard_buckets=True, cost="newton_schulz")(bucketed, 2)
    assert split.report().cost_imbalance == 1.0


def test_flat_refuses_a_matrix_optimizer_naming_the_parameter():
    specs = [ParamSpec(numel=4, name="bias"), matrix(B, "blocks.0.fc.weight")]
    specs[1] = ParamSpec(**{**specs[1].__dict__, "stepper": "Muon"})
    with pytest.raises(ValueError, match=r"'blocks.0.fc.weight' \(shape \(32, 2048\).*Muon is not one.*SortedGreedy"):
        Flat()(specs, 2)


def test_param_spec_of_reads_shape_and_declaration():
    spec = ParamSpec.of(torch.empty(3, 5, device="meta"), elementwise=False, stepper="Muon")
    assert (spec.shape, spec.numel, spec.elementwise, spec.stepper) == ((3, 5), 15, False, "Muon")
    assert ParamSpec.of(torch.empty((), device="meta")).shape == (1,)
    assert ParamSpec(numel=9).shape == (9,)
