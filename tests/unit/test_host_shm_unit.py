"""The shared-memory transport's refusals and registrations, without processes (:mod:`zero_lab.host_shm`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from zero_lab import host_shm
from zero_lab.collectives import COLLECTIVES, collective_named
from zero_lab.grad_reduce import _REGISTRY, P2PReduceScatter, grad_reduce_named


def test_ranks_on_two_hosts_are_refused_naming_them():
    host_shm.check_one_host(["node1", "node1", "node1"], "host_shm")  # one host: fine
    with pytest.raises(ValueError) as caught:
        host_shm.check_one_host(["node1", "node1", "node2"], "host_shm")
    message = str(caught.value)
    assert message.startswith("host_shm: ranks 0 and 2 of the group are on different hosts ('node1', 'node2')")
    assert "grad_reduce='reduce_scatter'" in message and "\n" not in message


def test_a_machine_without_x86_store_order_is_refused():
    host_shm.check_machine(["x86_64", "AMD64"], "host_shm")
    with pytest.raises(ValueError, match=r"host_shm: this machine is aarch64; .* x86-64's store ordering"):
        host_shm.check_machine(["x86_64", "aarch64"], "host_shm")


def test_a_tensor_off_the_cpu_is_refused():
    with pytest.raises(ValueError, match=r"grad_shm_reduce_scatter: a tensor on meta; .*reduce_scatter_native"):
        comm = SimpleNamespace(rank=0, world_size=2)  # refused before anything is set up
        host_shm.reduce_scatter(comm, [torch.empty(4, device="meta")] * 2, op="grad_shm_reduce_scatter")  # type: ignore[arg-type]


def test_opt_in_strategies_are_registered_but_never_auto_candidates():
    assert {"shm_reduce_scatter", "shm_all_reduce"} <= set(_REGISTRY.names())
    assert not {"shm_reduce_scatter", "shm_all_reduce"} & set(_REGISTRY.auto_names())
    assert "shm_all_gather" not in COLLECTIVES
    assert all(host_shm.uses_host_shm(grad_reduce_named(n)) for n in ("shm_reduce_scatter", "shm_all_reduce"))
    assert host_shm.uses_host_shm(collective_named("shm_all_gather"))
    assert not host_shm.uses_host_shm(grad_reduce_named("reduce_scatter"))
    # the bytes each rank sends for a bucket: the point-to-point twins' (so DDP's)
    shm, p2p = grad_reduce_named("shm_reduce_scatter"), P2PReduceScatter()
    assert shm.sent_bytes([5, 7, 9], 4, 3) == p2p.sent_bytes([5, 7, 9], 4, 3)
    assert grad_reduce_named("shm_all_reduce").sent_bytes([12], 4, 2) == grad_reduce_named("all_reduce").sent_bytes(
        [12], 4, 2
    )


def test_pieces_cover_a_length_and_fit_the_slot():
    assert host_shm._pieces(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert host_shm._pieces(0, 2) == [(0, 0), (0, 0)]
