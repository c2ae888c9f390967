"""Hierarchical sharding over two Slurm nodes with S = a node: ``srun --nodes=2 --ntasks-per-node=2
python train.py optim=zero_adam dist.shard_size=node grad_reduce=reduce_scatter`` trains the losses
and parameters of the same run on one host, bit for bit, and its bytes per link class say what
crossed the nodes: the gradients' replica all-reduce only (srun's ``SLURM_NTASKS_PER_NODE`` tells
which ranks share a node), never the parameter exchange; on one host nothing does."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.e2e.runs import summary, together, train
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_train_slurm import ok
from tests.slurm.test_train_slurm import train as train_on_cluster

HIER = (
    "logger=none",
    "progress=false",
    "steps=3",
    "optim=zero_adam",
    "dp=ddp",  # the DDP path's hierarchy (bitwise across hosts); dp=auto would take the engine
    "grad_reduce=reduce_scatter",
    "exchange=broadcast",
)


@pytest.fixture(scope="module")
def runs(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hierarchy")
    srun = ("srun", "--nodes=2", "--ntasks-per-node=2")
    two_nodes, one_host = together(
        # node: srun's tasks per node (2)
        functools.partial(
            train_on_cluster, slurm, *HIER, "dist.shard_size=node", f"hydra.run.dir={root}/two_nodes", launcher=srun
        ),
        functools.partial(
            train,
            *HIER,
            "dist.shard_size=2",
            "dist.world_size=4",
            "dist.max_ranks_per_core=2",
            f"hydra.run.dir={root}/one_host",
        ),
    )
    ok(two_nodes)
    ok(one_host)
    return root


def test_a_node_per_shard_group_trains_what_one_host_trains(runs):
    nodes, host = summary(runs / "two_nodes"), summary(runs / "one_host")
    assert nodes["world_size"] == host["world_size"] == 4 and nodes["shard_size"] == host["shard_size"] == 2
    assert nodes["losses"] == host["losses"] and nodes["param_checksum"] == host["param_checksum"]


def test_only_the_replica_all_reduce_crosses_nodes(runs):
    nodes, host = summary(runs / "two_nodes")["bytes_per_link"], summary(runs / "one_host")["bytes_per_link"]
    grads, params = nodes["grad_reduce"], nodes["param_exchange"]
    assert grads["inter_node"] == grads["inter_group"] and min(grads["inter_node"]) > 0
    assert grads["intra_node"] == grads["intra_group"]
    assert params["inter_node"] == [0, 0, 0, 0] and params["intra_node"] == params["intra_group"]
    # the same bytes on one host, all of them inside it
    assert host["grad_reduce"]["inter_group"] == grads["inter_group"]
    assert host["grad_reduce"]["inter_node"] == [0, 0, 0, 0] and host["param_exchange"]["inter_node"] == [0, 0, 0, 0]
