"""The step model (zero_lab.step_model, zero_lab.collective_cost): α-β costs, link classes, phases, overlap,
hierarchical sharding and the Communicator's bytes, checked against figures worked out by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zero_lab.collective_cost import (
    Collective,
    Crowded,
    Hardware,
    Link,
    bus_factor,
    bytes_by_link,
    latency_steps,
    nodes_spanned,
    seconds,
)
from zero_lab.partition import Flat, ParamSpec, SortedGreedy
from zero_lab.step_model import (
    ADAM_TOUCHES,
    STRATEGIES,
    ModeledStrategy,
    communicator_bytes,
    compute_seconds,
    newton_schulz_flops,
    p2p_busiest,
    predict_step,
)

GB = 1e9


def hardware(**changes) -> Hardware:
    """Round numbers: 100 GB/s inside a node of 8, 10 GB/s per rank between nodes, no latency."""
    figures = dict(
        name="round",
        ranks_per_node=8,
        intra=Link(0.0, 100 * GB),
        inter=Link(0.0, 10 * GB),
        matmul_flops=1e12,
        memory_bandwidth=1e11,
        overlap=0.0,
    )
    return Hardware(**(figures | changes))


def test_bus_factors_and_steps_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("reduce_scatter", 8) == bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == bus_factor("send_recv", 2) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    assert latency_steps("all_reduce", 8) == 14 and latency_steps("all_gather", 8) == 7
    assert latency_steps("all_reduce", 1024, "tree") == 20


def test_seconds_is_alpha_steps_plus_bus_bytes_over_bandwidth() -> None:
    h = hardware(intra=Link(1e-5, 100 * GB))
    # 1 GB all-reduce over 8 ranks of one node: 14 steps × 10 µs + 1.75 GB / 100 GB/s
    assert seconds(h, Collective("all_reduce", 10**9, 8, 1)) == pytest.approx(14e-5 + 0.0175)
    assert seconds(h, Collective("all_reduce", 10**9, 1, 1)) == 0.0


def test_a_collective_across_nodes_runs_at_the_nodes_nics_capped_by_the_node() -> None:
    h = hardware()
    # 64 ranks on 8 nodes: 8 rings, each through its own 10 GB/s NIC -> 80 GB/s (under the node's 100)
    assert seconds(h, Collective("reduce_scatter", 64 * 10**6, 64, 8)) == pytest.approx(63e6 / 80e9)
    # one rank per node (the peers of a hierarchical all-reduce): one NIC, 10 GB/s
    assert seconds(h, Collective("all_reduce", 8 * 10**6, 8, 8)) == pytest.approx(14e6 / 10e9)
    # 16 of a node's ranks would have 160 GB/s of NICs: the node's own links (100) cap it
    assert seconds(h, Collective("all_gather", 10**9, 32, 2)) == pytest.approx(31 / 32 * 1e9 / 100e9)


def test_a_point_to_point_message_goes_to_an_average_peer() -> None:
    """16 ranks on 2 nodes: 8 of a rank's 15 peers are on the other node."""
    message = Collective("send_recv", 15 * 10**6, 16, 2)
    assert bytes_by_link(message) == (pytest.approx(7e6), pytest.approx(8e6))
    # 8/15 of it through the rank's own 10 GB/s NIC, 7/15 at 100 GB/s inside the node
    assert seconds(hardware(), message) == pytest.approx(8e6 / 10e9 + 7e6 / 100e9)
    assert bytes_by_link(Collective("send_recv", 10**6, 8, 1)) == (10**6, 0.0)


def test_a_point_to_point_reduce_scatter_sends_the_mean_and_waits_on_the_busiest() -> None:
    """W=4 on 2 nodes of 2, 4 equal owners: each rank sends 3/4 of the gradient, 1/2 of it to the other node."""
    specs = specs_of(*[2**20] * 4)
    p2p = ModeledStrategy("p2p", "", Flat, grad_reduce="reduce_scatter")
    grads = predict_step(specs, p2p, hardware(ranks_per_node=2), 4, 1).phase("grad_reduce")
    psi = 16 * 2**20
    assert grads.inter_bytes == pytest.approx(psi / 2, rel=1e-6)
    assert grads.intra_bytes == pytest.approx(psi / 4, rel=1e-6)


def test_bytes_by_link_splits_the_hops() -> None:
    intra, inter = bytes_by_link(Collective("all_gather", 64 * 10**6, 64, 8))
    assert intra + inter == pytest.approx(63e6) and inter == pytest.approx(63e6 * 8 / 64)
    assert bytes_by_link(Collective("all_reduce", 8 * 10**6, 8, 8)) == (0.0, pytest.approx(14e6))
    assert bytes_by_link(Collective("all_reduce", 8 * 10**6, 8, 1)) == (pytest.approx(14e6), 0.0)
    assert nodes_spanned(range(0, 64, 8), 8) == 8 and nodes_spanned(range(8), 8) == 1


def test_hardware_names_every_bad_figure() -> None:
    with pytest.raises(ValueError, match=r"'bad'.*ranks_per_node=0.*overlap=2.*algorithm='mesh'.*\['gather'\]"):
        hardware(name="bad", ranks_per_node=0, overlap=2, algorithm="mesh", collectives={"gather": Link(0, 1)})


def specs_of(*numels: int) -> list[ParamSpec]:
    return [ParamSpec(numel=n, name=f"layer{i}.weight") for i, n in enumerate(numels)]


def test_ddp_phases_by_hand() -> None:
    """4 parameters of 1 M floats (16 MB), W = 8 on one node, 10 samples per rank."""
    specs = specs_of(*[10**6] * 4)
    p = predict_step(specs, STRATEGIES["ddp"], hardware(), 8, samples_per_rank=10)
    # the FLOPs at matmul_flops plus one read of the 16 MB of weights per pass at memory_bandwidth
    assert p.phase("forward").seconds == pytest.approx(2 * 4e6 * 10 / 1e12 + 16e6 / 1e11)
    assert p.phase("backward").seconds == pytest.approx(4 * 4e6 * 10 / 1e12 + 16e6 / 1e11)
    assert p.phase("grad_reduce").seconds == pytest.approx(1.75 * 16e6 / 100e9)
    assert p.phase("grad_reduce").intra_bytes == pytest.approx(1.75 * 16e6)
    assert p.phase("step").seconds == pytest.approx(16e6 * ADAM_TOUCHES / 1e11)
    assert p.phase("exchange").seconds == 0.0
    # DDP copies each gradient into its bucket and back: a read and a write each, 4 touches of 16 MB
    assert p.phase("grad_copies").seconds == pytest.approx(4 * 16e6 / 1e11)
    assert p.seconds == pytest.approx(sum(ph.seconds for ph in p.phases))  # overlap 0: nothing hides
    assert predict_step(iter(specs), STRATEGIES["ddp"], hardware(), 8, samples_per_rank=10) == p  # any iterable
    engine = predict_step(specs, STRATEGIES["zero2_engine"], hardware(), 8, samples_per_rank=10)
    assert engine.phase("grad_copies").seconds == pytest.approx(2 * 16e6 / 1e11)  # written once into its buffer


def test_overlap_hides_all_but_the_last_bucket_behind_backward() -> None:
    specs = specs_of(*[10**6] * 4)  # DDP's buckets: 4 MB alone (first, 1 MiB cap), then 12 MB
    ddp = STRATEGIES["ddp"]
    apart = predict_step(specs, ddp, hardware(), 8, samples_per_rank=10_000)
    hidden = predict_step(specs, ddp, hardware(overlap=1.0), 8, samples_per_rank=10_000)
    last_bucket = 1.75 * 4e6 / 100e9  # DDP reduces the bucket of the first layer last
    assert hidden.phase("grad_reduce").exposed_s == pytest.approx(last_bucket)
    assert apart.seconds - hidden.seconds == pytest.approx(1.75 * 12e6 / 100e9)


def test_zero1_steps_the_slowest_owner_and_exchanges_the_padded_buffer() -> None:
    specs = specs_of(3_000_000, 1_000_000, 1_000_000, 1_000_000)
    greedy = predict_step(specs, STRATEGIES["zero1_sorted_greedy"], hardware(), 4, 1)
    assert greedy.imbalance == pytest.approx(3e6 / 1.5e6)  # the 3 M parameter alone on one rank
    assert greedy.phase("step").seconds == pytest.approx(12e6 * ADAM_TOUCHES / 1e11)
    assert greedy.phase("exchange").seconds == pytest.approx(0.75 * 4 * 12e6 / 100e9)  # W × the largest range
    flat = predict_step(specs, STRATEGIES["zero1_flat"], hardware(), 4, 1)
    assert flat.phase("step").seconds == pytest.approx(6e6 * ADAM_TOUCHES / 1e11)
    assert flat.phase("exchange").seconds == pytest.approx(0.75 * 24e6 / 100e9)


def test_hierarchical_sharding_moves_a_shard_across_groups() -> None:
    """W = 64 on 8 nodes, S = 8 (a node): reduce-scatter inside, all-reduce of Ψ/8 across, all-gather inside."""
    specs = specs_of(*[2**20] * 8)  # 32 MiB: buckets 4 MiB (first) then 28 MiB (25 MiB cap: 24 + 4)
    engine = STRATEGIES["zero2_engine"]
    p = predict_step(specs, engine, hardware(), 64, 1, shard_size=8)
    psi = 32 * 2**20
    grad = p.phase("grad_reduce")
    assert grad.intra_bytes == pytest.approx(7 / 8 * psi)
    assert grad.inter_bytes == pytest.approx(2 * 7 / 8 * psi / 8)
    assert p.phase("exchange").inter_bytes == 0.0 and p.phase("exchange").intra_bytes == pytest.approx(7 / 8 * psi)
    assert grad.seconds == pytest.approx(7 / 8 * psi / 100e9 + 2 * 7 / 8 * psi / 8 / 10e9)
    flat = predict_step(specs, engine, hardware(), 64, 1)  # S = W: every collective crosses nodes at 80 GB/s
    assert flat.phase("grad_reduce").seconds == pytest.approx(63 / 64 * psi / 80e9)
    assert flat.phase("grad_reduce").inter_bytes == pytest.approx(63 / 64 * psi * 8 / 64)
    assert predict_step(specs, engine, hardware(), 64, 1, shard_size=1).phase("step").seconds == pytest.approx(
        psi * ADAM_TOUCHES / 1e11
    )
    with pytest.raises(ValueError, match="shard_size=3 must be a positive divisor of world_size=64"):
        predict_step(specs, engine, hardware(), 64, 1, shard_size=3)


def test_native_reduce_scatter_pays_for_the_owner_that_holds_a_bucket() -> None:
    specs = specs_of(4 * 2**20)  # one 16 MiB parameter, one bucket, one owner under sorted_greedy
    native = ModeledStrategy("rs", "", SortedGreedy, grad_reduce="reduce_scatter_native")
    p = predict_step(specs, native, hardware(), 8, 1)
    assert p.phase("grad_reduce").seconds == pytest.approx(7 / 8 * 8 * 16 * 2**20 / 100e9)  # W × the bucket
    owned = predict_step(specs, STRATEGIES["zero2_engine"], hardware(), 8, 1)
    assert owned.phase("grad_reduce").seconds == pytest.approx(7 / 8 * 16 * 2**20 / 100e9)


def test_point_to_point_reduce_scatter_is_set_by_the_busiest_rank() -> None:
    specs = specs_of(4 * 2**20)
    p2p = ModeledStrategy("p2p", "", SortedGreedy, grad_reduce="reduce_scatter")
    p = predict_step(specs, p2p, hardware(), 4, 1)
    assert p.phase("grad_reduce").seconds == pytest.approx(3 * 16 * 2**20 / 100e9)  # the owner receives 3 buckets


def test_point_to_point_duplex_takes_the_larger_way_else_the_mean_of_both() -> None:
    """Owners of 4, 6, 6, 6 bytes of a 22-byte bucket: rank 0 sends 18 and receives 3 × 4 = 12, ranks 1-3
    send 16 and receive 18. Duplex: max(18, 12) = 18 and max(16, 18) = 18; one thread's copies:
    (18 + 12) / 2 = 15 and (16 + 18) / 2 = 17."""
    assert p2p_busiest([4, 6, 6, 6], duplex=True) == 18
    assert p2p_busiest([4, 6, 6, 6], duplex=False) == 17
    # one 16 MiB bucket, one owner at W=4: it receives 3 × 16 MiB, each peer sends 16 MiB; every
    # message is in flight at once, so α is paid once, not once per peer
    specs, mib16 = specs_of(4 * 2**20), 16 * 2**20
    p2p = ModeledStrategy("p2p", "", SortedGreedy, grad_reduce="reduce_scatter")
    slow = hardware(intra=Link(1e-3, 100 * GB))
    full = predict_step(specs, p2p, slow, 4, 1).phase("grad_reduce")
    assert full.seconds == pytest.approx(1e-3 + 3 * mib16 / 100e9)
    shared = predict_step(specs, p2p, replace(slow, duplex=False), 4, 1).phase("grad_reduce")
    assert shared.seconds == pytest.approx(1e-3 + 1.5 * mib16 / 100e9)
    # the bytes are an average rank's either way: 3/4 of the bucket sent
    assert full.intra_bytes == shared.intra_bytes == pytest.approx(0.75 * mib16, rel=1e-6)


def test_a_calibrated_point_to_point_reduce_scatter_prices_the_hooks_strategy() -> None:
    """With a ``p2p_reduce_scatter`` fit (the strategy timed with its receive buffers and adds), the
    hook's reduce-scatter is that op on the even bucket its busiest rank's load equals: 3 α plus
    3/4 of it at the fit's bandwidth at W=4; without one, one send_recv of the busiest load."""
    specs, mib16 = specs_of(4 * 2**20), 16 * 2**20  # one 16 MiB bucket
    fit = {"send_recv": Link(1e-3, 100 * GB), "p2p_reduce_scatter": Link(2e-3, 1 * GB)}
    calibrated = hardware(collectives=fit, duplex=False)
    even = ModeledStrategy("p2p", "", Flat, grad_reduce="reduce_scatter")  # 4 MiB segments: 12 out, 12 in
    phase = predict_step(specs, even, calibrated, 4, 1).phase("grad_reduce")
    assert phase.seconds == pytest.approx(3 * 2e-3 + 0.75 * mib16 / GB)
    assert phase.collectives == (Collective("p2p_reduce_scatter", mib16, 4),)
    assert phase.intra_bytes == pytest.approx(0.75 * mib16, rel=1e-6)  # the bytes as before: an average rank's
    # one owner of the whole bucket receives 3 × 16 MiB and sends nothing: (0 + 48) / 2 = 24 MiB, a 32 MiB bucket's load
    one_owner = ModeledStrategy("p2p", "", SortedGreedy, grad_reduce="reduce_scatter")
    busiest = predict_step(specs, one_owner, calibrated, 4, 1).phase("grad_reduce")
    assert busiest.seconds == pytest.approx(3 * 2e-3 + 1.5 * mib16 / GB)
    # 4 ranks on 2 cores take turns: the bucket's total copies set the time, the even bucket's price
    crowded = predict_step(specs, one_owner, replace(calibrated, cores=2), 4, 1).phase("grad_reduce")
    assert crowded.seconds == pytest.approx(3 * 2e-3 + 0.75 * mib16 / GB)
    assert crowded.intra_bytes == busiest.intra_bytes  # the bytes do not change, only who waits
    assert predict_step(specs, one_owner, replace(calibrated, cores=4), 4, 1).phase("grad_reduce") == busiest
    # a group spanning nodes (2 of 2 ranks here) keeps its busiest rank, crowded or not: its link carries those bytes
    two_nodes = replace(calibrated, ranks_per_node=2)
    spanning = predict_step(specs, one_owner, replace(two_nodes, cores=2), 4, 1).phase("grad_reduce")
    assert spanning == predict_step(specs, one_owner, two_nodes, 4, 1).phase("grad_reduce") != crowded
    old = hardware(collectives={"send_recv": Link(1e-3, 100 * GB)}, duplex=False)  # a profile before the op
    before = predict_step(specs, even, old, 4, 1).phase("grad_reduce")
    assert before.seconds == pytest.approx(1e-3 + 0.75 * mib16 / 1e11)


def test_muon_owner_step_is_newton_schulz_on_the_slowest_owner() -> None:
    assert newton_schulz_flops((100, 300)) == 5 * (4 * 100 * 100 * 300 + 2 * 100**3)
    specs = [
        ParamSpec(numel=512 * 2048, shape=(512, 2048), elementwise=False, name="a.weight"),
        ParamSpec(numel=1024 * 1024, shape=(1024, 1024), elementwise=False, name="b.weight"),
    ]
    p = predict_step(specs, STRATEGIES["zero1_muon"], hardware(), 2, 1)
    slowest = max(newton_schulz_flops(s.shape) / 1e12 + s.nbytes * 5 / 1e11 for s in specs)
    assert p.phase("step").seconds == pytest.approx(slowest)


def test_shared_cores_slow_compute() -> None:
    h = hardware(cores=2)
    one = predict_step(specs_of(10**6), STRATEGIES["ddp"], h, 2, 10).phase("forward").seconds
    four = predict_step(specs_of(10**6), STRATEGIES["ddp"], h, 4, 10).phase("forward").seconds
    assert four == pytest.approx(2 * one)


def test_compute_is_the_flops_plus_a_read_of_the_weights_per_pass() -> None:
    """Forward 2·F FLOPs + every parameter read once (frozen ones too: the forward still streams
    them); backward 4·F FLOPs (trainable only) + another read. A crowded host shares the profile's
    own rates evenly, whatever its crowded world measured (that prices the step and the collectives)."""
    specs = [ParamSpec(numel=10**6, name="a.weight"), ParamSpec(numel=10**6, name="b.weight", trainable=False)]
    forward, backward = compute_seconds(specs, 10, hardware(), 1)
    assert forward == pytest.approx(2 * 1e6 * 10 / 1e12 + 8e6 / 1e11)
    assert backward == pytest.approx(4 * 1e6 * 10 / 1e12 + 8e6 / 1e11)
    crowded = hardware(cores=2, crowded={4: Crowded({}, matmul_flops=1e9, memory_bandwidth=1e9)})
    assert compute_seconds(specs, 10, crowded, 4) == pytest.approx((2 * forward, 2 * backward))
    assert compute_seconds(specs, 10, crowded, 2) == pytest.approx((forward, backward))


def test_a_crowded_world_is_priced_as_the_calibration_measured_it() -> None:
    """W > cores: the measured world's own fits and per-rank rates (the sharing measured, not
    assumed); beyond it the rates shared further (× m / W); W <= cores, or no cores (a cluster):
    the profile itself, so the at-scale tables do not move."""
    crowded = Crowded({"all_reduce": Link(1e-3, 1 * GB)}, matmul_flops=4e11, memory_bandwidth=2e10)
    h = hardware(cores=2, collectives={"all_reduce": Link(0.0, 10 * GB)}, crowded={4: crowded})
    assert h.on_host(2) is h and hardware().on_host(1024) == hardware()
    four = h.on_host(4)
    assert (four.matmul_flops, four.memory_bandwidth, four.cores, four.crowded) == (4e11, 2e10, None, {})
    assert four.collectives["all_reduce"] == Link(1e-3, 1 * GB)
    eight = h.on_host(8)  # 8 ranks on what 4 measured: the rates halve again, the fits are the 4-rank world's
    assert (eight.matmul_flops, eight.memory_bandwidth) == (2e11, 1e10) and eight.collectives == four.collectives
    # no crowded world measured, or a rate it did not measure: the cores shared evenly (cores / W)
    even = hardware(cores=2).on_host(4)
    assert (even.matmul_flops, even.memory_bandwidth) == (0.5e12, 0.5e11)
    partial = hardware(cores=2, crowded={4: Crowded({}, matmul_flops=3e11)}).on_host(4)
    assert (partial.matmul_flops, partial.memory_bandwidth) == (3e11, 0.5e11)
    # DDP at W=4 by hand on the measured world: 16 MB in one bucket, 10 samples per rank
    p = predict_step(specs_of(4 * 10**6), STRATEGIES["ddp"], h, 4, samples_per_rank=10)
    # the forward and backward at the profile's own rates shared evenly (cores / W = 1/2), not the crowded ones
    assert p.phase("forward").seconds == pytest.approx(2 * 4e6 * 10 / 0.5e12 + 16e6 / 0.5e11)
    assert p.phase("grad_reduce").seconds == pytest.approx(6 * 1e-3 + 1.5 * 16e6 / 1e9)
    assert p.phase("step").seconds == pytest.approx(16e6 * ADAM_TOUCHES / 2e10)
    assert p.phase("grad_copies").seconds == pytest.approx(4 * 16e6 / 2e10)
    # at W = 2 (one core each) the profile's own fit and rates
    two = predict_step(specs_of(4 * 10**6), STRATEGIES["ddp"], h, 2, samples_per_rank=10)
    assert two.phase("grad_reduce").seconds == pytest.approx(16e6 / 10e9)
    assert two.phase("forward").seconds == pytest.approx(2 * 4e6 * 10 / 1e12 + 16e6 / 1e11)
    with pytest.raises(ValueError, match=r"crowded world 2 needs cores < 2, got cores=2.*crowded\.4\.collectives"):
        hardware(cores=2, crowded={2: Crowded(), 4: Crowded({"gather": Link(0, 1)})})


def test_strategy_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="'x': grad_reduce='scatter'"):
        ModeledStrategy("x", "", Flat, grad_reduce="scatter")
    with pytest.raises(ValueError, match="DDP steps every parameter"):
        ModeledStrategy("x", "", None, grad_reduce="owned", exchange="none")


def test_communicator_bytes_by_hand() -> None:
    """What zero_lab's Communicators count, in their conventions (the Gloo test compares with real counts)."""
    specs = specs_of(10, 7, 5)  # 22 floats: flat chunks of ceil(22/4) = 6, padded buffer 24
    flat_bc = ModeledStrategy("f", "", Flat, exchange="broadcast")
    assert communicator_bytes(specs, flat_bc, 4, rank=1)["exchange"] == (24 * 4, 6 * 4 * 3)
    flat_ag = ModeledStrategy("f", "", Flat, exchange="all_gather")
    assert communicator_bytes(specs, flat_ag, 4, rank=1)["exchange"] == (96, 96 * 3 // 4)
    greedy_ag = ModeledStrategy("g", "", SortedGreedy, exchange="all_gather")  # owners 10 | 7 | 5 | -
    assert communicator_bytes(specs, greedy_ag, 4, rank=0)["exchange"] == (4 * 40, 4 * 40 * 3 // 4)
    greedy_bc = ModeledStrategy("g", "", SortedGreedy, exchange="broadcast", bucket_view=False)
    assert communicator_bytes(specs, greedy_bc, 4, rank=1)["exchange"] == (88, 28 * 3)
    rs = ModeledStrategy("r", "", Flat, grad_reduce="reduce_scatter", exchange="broadcast")
    owned = 6 * 4  # rank 1 owns elements 6..11
    assert communicator_bytes(specs, rs, 4, rank=1)["grad_reduce"] == (88 - owned + 3 * owned, 88 - owned)
    assert communicator_bytes(specs, STRATEGIES["ddp"], 4, rank=0)["grad_reduce"] == (88, 2 * 88 * 3 // 4)
    assert communicator_bytes(specs, rs, 1, rank=0) == {"grad_reduce": (0, 0), "exchange": (0, 0)}
    assert communicator_bytes(specs, flat_bc, 1, rank=0) == {"grad_reduce": (88, 0), "exchange": (0, 0)}  # DDP's
    assert math.isclose(sum(communicator_bytes(specs, rs, 4, r)["grad_reduce"][1] for r in range(4)), 3 * 88)


def test_communicator_bytes_hierarchical_by_hand() -> None:
    """W=4 as 2 × 2: the state over groups of 2 (flat halves of 11 floats), rank 3 is index 1 of group [2, 3]."""
    specs = specs_of(10, 7, 5)  # 22 floats, 88 bytes, one DDP bucket
    rs = ModeledStrategy("r", "", Flat, grad_reduce="reduce_scatter", exchange="broadcast")
    own = 11 * 4
    counted = communicator_bytes(specs, rs, 4, rank=3, shard_size=2)
    # p2p inside the group: sends the other half (44), receives one contribution to its own (44); then
    # its reduced half all-reduced across the 2 replicas: 44 counted, 2 · 44 · 1/2 sent
    assert counted["grad_reduce"] == (88 - own + own + own, 88 - own + own)
    assert counted["exchange"] == (88, own * 1)  # one broadcast per owner's half, inside the group
    assert communicator_bytes(specs, rs, 4, rank=1, shard_size=4) == communicator_bytes(specs, rs, 4, rank=1)
    ddp_like = communicator_bytes(specs, rs, 4, rank=0, shard_size=1)  # S = 1: no exchange
    assert ddp_like["exchange"] == (0, 0)
    assert ddp_like["grad_reduce"] == (88, 2 * 88 * 3 // 4)  # the whole gradient all-reduced over 4 replicas
    with pytest.raises(ValueError, match="shard_size=3 must be a positive divisor of world_size=4"):
        communicator_bytes(specs, rs, 4, rank=0, shard_size=3)
