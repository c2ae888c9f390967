"""The link benchmark's pure parts (zero_lab.bench.link, link_bench): the two-node hardware the step
model prices, its bytes across the link at S = a node and S = W worked out by hand, and the table."""

from __future__ import annotations

import pytest

from zero_lab.bench.link import CONFIGS, SAMPLES_PER_RANK, link_hardware, mlp_specs, predict_link
from zero_lab.bench.link_bench import LinkRow, format_rows

PSI = sum(spec.nbytes for spec in mlp_specs())  # the default MLP's fp32 parameters: 3,152,896 B


def test_the_veth_is_shared_by_a_nodes_ranks() -> None:
    hardware = link_hardware(100, ranks_per_node=2)
    assert hardware.ranks_per_node == 2 and hardware.collectives == {}
    assert hardware.inter.bus_bandwidth == pytest.approx(100e6 / 8 / 2)
    assert "tbf rate 100 Mbit/s" in hardware.sources["inter"]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_bytes_across_by_hand(config: str) -> None:
    """W=4 on 2 nodes of 2, flat owners of Ψ/4. S=2: each rank all-reduces its Ψ/2 shard with its
    replica on the other node (Ψ/2 sent, all of it across): 2Ψ. S=4: each rank sends its 3 foreign
    segments point to point, 2 of them across (Ψ/2), and the all-gather's ring crosses on 2 of its 4
    hops, each carrying 3Ψ/4: 4 × Ψ/2 + 2 × 3Ψ/4 = 3.5Ψ — 1.75 × more."""
    assert PSI == 3_152_896
    strategy, hardware = CONFIGS[config].strategy, link_hardware(100)
    hier = predict_link(strategy, hardware, 4, 2, SAMPLES_PER_RANK, mlp_specs())[1]
    flat = predict_link(strategy, hardware, 4, 4, SAMPLES_PER_RANK, mlp_specs())[1]
    assert hier == pytest.approx(2 * PSI, rel=1e-6)
    assert flat == pytest.approx(3.5 * PSI, rel=1e-6)


def test_the_table_says_what_is_unmetered_and_the_ratios() -> None:
    rows = [
        LinkRow("engine", 2, 0.25, 0.20, 6e6, 6.06e6, None),
        LinkRow("engine", 4, 0.50, 0.50, 12e6, 12e6, 20_000_000),
    ]
    text = format_rows(rows)
    assert "| engine | 2 | 250.0 | 200.0 | +25.0 % | 6.000 | 6.060 | -1.0 % | — (not metered) |" in text
    assert "| engine | 4 | 500.0 | 500.0 | +0.0 % | 12.000 | 12.000 | +0.0 % | 20.000 |" in text
    assert "| engine | 2.00 × | 2.50 × | 2.00 × | 1.98 × |" in text


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_config_names_modes_that_cross_the_link(config: str) -> None:
    """The namespaced "nodes" are one host: a mode through host shared memory (the engine's default
    there) would go around the slowed veth this benchmark measures. Each config names its gradient
    reduction and its exchange, and neither is a host_shm strategy."""
    from zero_lab.collectives import collective_named
    from zero_lab.grad_reduce import grad_reduce_named

    named = dict(o.split("=", 1) for o in CONFIGS[config].overrides)
    assert {"grad_reduce", "exchange"} <= set(named)
    assert not getattr(grad_reduce_named(named["grad_reduce"]), "host_shm", False)
    assert not getattr(collective_named(named["exchange"]), "host_shm", False)
