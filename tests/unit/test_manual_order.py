"""Manual partitioning that scales: ``Manual(order=[...])`` and :func:`contiguous_split`,
pure, checked against brute force on small inputs and for invariants at many world sizes."""

from __future__ import annotations

import itertools
import random

import pytest

from zero_lab.partition import Manual, ParamSpec, contiguous_split


def best_largest_run(sizes: list[int], world_size: int) -> int:
    """The optimum by brute force: every way to place world_size - 1 cuts."""
    best = sum(sizes)
    for cuts in itertools.combinations(range(1, len(sizes)), min(world_size, len(sizes)) - 1):
        bounds = (0, *cuts, len(sizes))
        best = min(best, max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def runs(sizes: list[int], ranks: list[int], world_size: int) -> list[int]:
    loads = [0] * world_size
    for size, rank in zip(sizes, ranks):
        loads[rank] += size
    return loads


@pytest.mark.parametrize("seed", range(40))
def test_contiguous_split_is_optimal_and_in_order(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([1, 3, 10, 100, 1000]) for _ in range(rng.randint(1, 8))]
    world = rng.randint(1, 6)
    ranks = contiguous_split(sizes, world)
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] < world  # contiguous, ranks in order
    assert max(runs(sizes, ranks, world)) == best_largest_run(sizes, world)
    if len(sizes) >= world:
        assert set(ranks) == set(range(world))  # nobody idle while there is a parameter to own


@pytest.mark.parametrize("world", [1, 2, 3, 7, 64, 1000, 4096])
def test_contiguous_split_at_scale(world):
    rng = random.Random(world)
    sizes = [rng.randint(1, 10**6) for _ in range(3000)]
    ranks = contiguous_split(sizes, world)
    loads = runs(sizes, ranks, world)
    assert ranks == sorted(ranks) and max(ranks) == min(world, len(sizes)) - 1
    assert max(loads) <= max(sum(sizes) / world, max(sizes)) * 2  # never worse than 2x the lower bound
    assert max(loads) >= max(sum(sizes) / world, max(sizes))  # and the bound is a bound


def lm_specs() -> list[ParamSpec]:
    names = ["tok_emb.weight", "pos_emb.weight"]
    names += [f"blocks.{b}.{p}" for b in range(4) for p in ("qkv.weight", "qkv.bias", "out.weight")]
    names += ["head.weight", "frozen.scale"]
    sizes = [6400, 320] + [3000, 30, 1000] * 4 + [6400, 5]
    return [ParamSpec(numel=n, name=m, trainable=m != "frozen.scale") for m, n in zip(names, sizes)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 16])
def test_order_partitions_any_world_size_in_the_given_order(world):
    specs = lm_specs()
    partition = Manual(order=["head.*", "tok_emb.*", "pos_emb.*", "blocks.*"])(specs, world)
    owners = partition.owners()
    index = {s.name: i for i, s in enumerate(specs)}
    sequence = ["head.weight", "tok_emb.weight", "pos_emb.weight"] + [
        s.name for s in specs if s.name and s.name.startswith("blocks.")
    ]
    ranks = [owners[index[name]] for name in sequence]
    assert ranks == sorted(ranks)  # the order's neighbours stay together
    trainable = [s.numel for s in specs if s.trainable]
    loads = partition.report().numel_per_rank
    assert sum(loads) == sum(s.numel for s in specs)  # the frozen one is owned too
    expected = best_largest_run([specs[index[n]].numel for n in sequence], world)
    assert max(loads) <= expected + 5  # optimal for the trainable ones (+ the frozen scalar)
    assert sum(trainable) == sum(specs[index[n]].numel for n in sequence)


def test_first_matching_pattern_wins_and_every_trainable_parameter_is_needed():
    specs = lm_specs()
    partition = Manual(order=["blocks.0.*", "*"])(specs, 2)
    assert partition.owners()[2] == 0  # blocks.0.qkv.weight comes first
    with pytest.raises(ValueError, match=r"order leaves trainable parameters without an owner: 'head.weight'"):
        Manual(order=["tok_emb.*", "pos_emb.*", "blocks.*"])(specs, 2)


def test_params_per_rank_wins_over_order_and_bad_input_is_named():
    specs = lm_specs()
    listed = Manual(params_per_rank=[["*"], []], order=["*"])
    assert listed.order is None and set(listed(specs, 2).owners()) == {0}
    with pytest.raises(ValueError, match=r"params_per_rank has 2 entries but world_size is 3.*list of lists"):
        listed(specs, 3)
    with pytest.raises(ValueError, match=r"pattern 're:blocks\.\(' is not a valid regular expression"):
        Manual(order=["re:blocks.("])(specs, 2)
    with pytest.raises(ValueError, match=r"pattern 'decoder.\*' matches no parameter name"):
        Manual(order=["decoder.*"])(specs, 2)
    with pytest.raises(ValueError, match=r"needs params_per_rank .* or order"):
        Manual()
    with pytest.raises(TypeError, match=r"order must be a list of name patterns"):
        Manual(order="blocks.*")
