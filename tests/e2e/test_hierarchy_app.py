"""``dist.shard_size`` through the real ``python train.py`` at W=4 as 2 × 2: ZeRO-Adam sharded over
shard groups of 2 (replicated across the 2 groups) trains to DDP + Adam's losses and parameters
(bitwise with DDP's all-reduce), and so do the DDP overlap hooks (``overlap=true``, each shard group
stepping and exchanging inside itself) and zero_lab's engine (``dp=zero_lab``); with
``grad_reduce=reduce_scatter`` summary.json, W&B and the report split each phase's bytes by link
class, and the split is what the partition implies."""

from __future__ import annotations

import pytest

from tests.e2e.runs import summary, train_together, wandb_records
from tests.e2e.test_metrics import wandb_summary
from tests.e2e.test_report import report, table
from zero_lab.report.table import format_bytes

WORLD = ("dist.world_size=4", "dist.max_ranks_per_core=2", "steps=3", "exchange=broadcast")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("hierarchy")
    results = train_together(
        (*WORLD, "optim=zero_adam", "dp=ddp", "dist.shard_size=2", "logger=none", f"hydra.run.dir={base / 'hier'}"),
        (
            *WORLD,
            "optim=zero_adam",
            "dp=ddp",  # the DDP path's hierarchy: bitwise DDP's at W=4 (the engine's is within 1e-5, below)
            "dist.shard_size=2",
            "grad_reduce=reduce_scatter",
            "logger=wandb",
            f"hydra.run.dir={base / 'hier_rs'}",
        ),
        (*WORLD, "optim=adam", "logger=none", f"hydra.run.dir={base / 'ddp'}"),
        (*WORLD, "optim=adam", "dp=zero_lab", "dist.shard_size=2", "logger=none", f"hydra.run.dir={base / 'engine'}"),
        (*WORLD, "optim=zero_adam", "overlap=true", "dist.shard_size=2", "logger=none", f"hydra.run.dir={base / 'o'}"),
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return base


def test_two_by_two_trains_to_ddps_parameters(runs):
    hier, ddp, rs = summary(runs / "hier"), summary(runs / "ddp"), summary(runs / "hier_rs")
    assert hier["shard_size"] == 2 and ddp["shard_size"] is None
    assert hier["losses"] == ddp["losses"] and hier["param_checksum"] == ddp["param_checksum"]
    assert rs["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
    # the state is split over 2 ranks, not 4: ranks r and r+2 hold the same shard
    state = hier["optim_state_bytes"]
    assert state[0] == state[2] and state[1] == state[3]
    assert state[0] + state[1] == pytest.approx(ddp["optim_state_bytes"][0], rel=0.01)


def test_the_engine_shards_over_groups_of_two_too(runs):
    engine, ddp = summary(runs / "engine"), summary(runs / "ddp")
    assert engine["dp"] == "zero_lab" and engine["engine"]["shard_size"] == 2 and engine["shard_size"] == 2
    assert engine["losses"] == pytest.approx(ddp["losses"], rel=1e-5)  # reduced in the group, then across
    state = engine["optim_state_bytes"]
    assert state[0] == state[2] and state[1] == state[3]
    assert links_inside_groups(engine["bytes_per_link"]["param_exchange"])
    grads = engine["bytes_per_link"]["grad_reduce"]  # reduced inside the group, each owned range across it
    assert min(grads["intra_group"]) > 0 and min(grads["inter_group"]) > 0
    sent = [inside + across for inside, across in zip(grads["intra_group"], grads["inter_group"])]
    assert engine["bytes_per_step"]["grad_reduce"] == sent


def test_the_overlap_hooks_step_and_exchange_inside_each_shard_group(runs):
    overlap, ddp = summary(runs / "o"), summary(runs / "ddp")
    assert overlap["overlap"] and overlap["shard_size"] == 2
    assert overlap["losses"] == ddp["losses"] and overlap["param_checksum"] == ddp["param_checksum"]
    state = overlap["optim_state_bytes"]
    assert state[0] == state[2] and state[1] == state[3]
    assert links_inside_groups(overlap["bytes_per_link"]["param_exchange"])


def links_inside_groups(links: dict[str, list[float]]) -> bool:
    """Every byte of a phase stayed inside its shard group and its node (one host)."""
    crossed = links["inter_group"] + links["inter_node"]
    return crossed == [0] * 8 and min(links["intra_group"]) > 0


def test_bytes_per_link_follow_the_partition(runs):
    rs = summary(runs / "hier_rs")
    links, sent = rs["bytes_per_link"], rs["bytes_per_step"]
    for phase in ("grad_reduce", "param_exchange"):
        for rank in range(4):
            total = sent[phase][rank]
            by_link = {link: values[rank] for link, values in links[phase].items()}
            assert by_link["intra_group"] + by_link["inter_group"] == total
            assert by_link["intra_node"] == total and by_link["inter_node"] == 0  # one host: one node
    assert links_inside_groups(links["param_exchange"])  # parameters move inside the group only
    # across groups: each owner's segment once (an all-reduce between 2 replicas sends n of n bytes); inside
    # the group: every element this rank does not own. Together: the model's gradient bytes, once.
    inter, intra = links["grad_reduce"]["inter_group"], links["grad_reduce"]["intra_group"]
    model_bytes = inter[0] + inter[1]
    assert inter[0] == inter[2] and inter[1] == inter[3] and 0 < inter[0] < model_bytes
    assert [i + j for i, j in zip(intra, inter)] == [model_bytes] * 4


def test_wandb_and_the_report_carry_the_split(runs, tmp_path):
    values = wandb_summary(wandb_records(runs / "hier_rs"))
    links = summary(runs / "hier_rs")["bytes_per_link"]
    assert values["comm/bytes_per_link/grad_reduce/inter_group/rank1"] == links["grad_reduce"]["inter_group"][1]
    result = report(runs / "hier_rs", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = table(tmp_path / "out").values()
    fullest = max(links["grad_reduce"]["inter_group"])
    assert row["sent/step across groups / nodes"] == f"{format_bytes(fullest)} / {format_bytes(0)}"
