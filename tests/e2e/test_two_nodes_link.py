"""A W=4 job on two "nodes" joined by a rate-limited veth (:mod:`zero_lab.bench.netns`): what the
kernel counts crossing the link against what the app meters and what the step model predicts.

``torchrun --nnodes 2 --nproc_per_node 2`` in each network namespace trains ZeRO-Adam on DDP
(``grad_reduce=reduce_scatter``, flat buffers all-gathered) at ``dist.shard_size=node`` (S=2) and
at S=4 (the whole world), each at 1 and 3 steps: the difference of the veth's ``tx_bytes`` over
those two runs is what two training steps sent across (start-up cancels). Checked:

* S = a node: summary.json's inter-node bytes (the gradient shards' all-reduce between the two
  replicas, the only collective that leaves a node) equal the kernel's count, ±2 %;
* both S: the kernel's count equals the step model's inter-node bytes ×W, ±2 %, and S=4 sends
  across the link the factor more that the model predicts (1.75: the gradient exchange costs both
  the same, the all-gather leaves the node only at S=4).

At S=4 the app meters every byte of a collective whose group spans nodes as inter-node (the
slow link it waits on; which hops cross is Gloo's choice, :mod:`zero_lab.comm`), which is more
than crosses, and each point-to-point message by its peer's node, exactly: the test pins that
convention (the all-gather all inter-node, the reduce-scatter split) rather than the kernel's count.
No timing is asserted (the benchmark, ``scripts/bench_link.py``, times the link). Skipped, with the
reason, where the host cannot make namespaces with a tbf (not root, no iproute2, no tbf).
"""

from __future__ import annotations

import functools
import os

import pytest

from tests.e2e.runs import child_env, together
from zero_lab.bench.link import CONFIGS, SAMPLES_PER_RANK, link_hardware, measure_link, mlp_specs, predict_link
from zero_lab.bench.netns import TwoNodes, unavailable

RATE_MBIT = 1000  # fast: this test counts bytes; the benchmark slows the link
CONFIG = CONFIGS["ddp_path"]
BASE = ("logger=none", "progress=false", *CONFIG.overrides)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory):
    why = unavailable()
    if why:
        pytest.skip(f"two-node link test: {why}")
    root = tmp_path_factory.mktemp("link")

    def measure(shard: str, tag: str):
        with TwoNodes.create(RATE_MBIT, tag=tag) as nodes:
            overrides = (*BASE, f"dist.shard_size={shard}")
            return measure_link(nodes, overrides, 1, 3, root / shard, timeout_s=300, env=child_env())

    tag = f"zl{os.getpid() % 100000}"  # names of this process's own: another suite may run beside
    hier, flat = together(functools.partial(measure, "node", f"{tag}h"), functools.partial(measure, "4", f"{tag}w"))
    return {2: hier, 4: flat}


def predicted(shard: int) -> float:
    return predict_link(CONFIG.strategy, link_hardware(RATE_MBIT), 4, shard, SAMPLES_PER_RANK, mlp_specs())[1]


def test_a_node_per_shard_group_meters_what_crosses_the_link(measured):
    hier = measured[2]
    assert hier.long.summary["shard_size"] == 2 and hier.long.summary["world_size"] == 4
    links = hier.long.summary["bytes_per_link"]
    assert links["param_exchange"]["inter_node"] == [0, 0, 0, 0]  # parameters stay inside a node
    assert min(links["grad_reduce"]["inter_node"]) > 0
    assert hier.app_inter_node_per_step == pytest.approx(hier.crossed_per_step, rel=0.02)


def test_the_model_predicts_the_bytes_across_and_the_hierarchical_saving(measured):
    for shard, run in measured.items():
        assert run.crossed_per_step == pytest.approx(predicted(shard), rel=0.02), shard
    saving = measured[4].crossed_per_step / measured[2].crossed_per_step
    assert saving == pytest.approx(predicted(4) / predicted(2), rel=0.03)
    assert saving > 1.5


def test_a_world_wide_group_meters_its_collectives_as_inter_node_and_p2p_by_peer(measured):
    """At S = W the all-gather's group spans both nodes: all of it is charged ``inter_node`` (which hops
    cross is Gloo's choice); the point-to-point reduce-scatter's messages each by their peer's node."""
    links = measured[4].long.summary["bytes_per_link"]
    exchange, grads = links["param_exchange"], links["grad_reduce"]
    assert exchange["inter_node"] == [i + j for i, j in zip(exchange["intra_group"], exchange["inter_group"])]
    assert exchange["intra_node"] == [0, 0, 0, 0]
    sent = [i + j for i, j in zip(grads["intra_group"], grads["inter_group"])]
    assert [i + j for i, j in zip(grads["intra_node"], grads["inter_node"])] == sent
    assert min(grads["intra_node"]) > 0 and min(grads["inter_node"]) > 0  # to the node's other rank, and across
    # ... more than crosses: the all-gather's ring leaves the node on only some hops
    assert measured[4].app_inter_node_per_step > 1.2 * measured[4].crossed_per_step
