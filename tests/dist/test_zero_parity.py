"""ZeRO vs DDP + the same plain optimizer, on real Gloo worlds.

Many scenarios run inside one world (module fixture) and each test reads its row;
that keeps the multi-process cost to a few worlds for the whole file.
"""

from __future__ import annotations

import pytest

from tests import rank_programs as rp
from zero_lab.partition import Flat, Manual

TOL = 1e-6  # float32, same arithmetic: most cases are bitwise equal

CASES: dict[str, rp.Case] = {}
for opt in ("adam", "adamw", "sgd"):
    for bucket_view in (False, True):
        CASES[f"{opt}-bucket{int(bucket_view)}"] = rp.Case(optimizer=opt, bucket_view=bucket_view)
CASES.update(
    {
        "two-groups": rp.Case(layout="groups", optimizer="adamw"),
        "two-groups-bucket": rp.Case(layout="groups", optimizer="adamw", bucket_view=True),
        "named-params": rp.Case(layout="named"),
        "frozen": rp.Case(frozen=(0, 1)),
        "unfreeze-mid-run": rp.Case(frozen=(0, 1), unfreeze_at=4, bucket_view=True),
        "freeze-mid-run": rp.Case(freeze_at=5, bucket_view=True),
        "closure": rp.Case(closure=True),
        "lr-scheduler": rp.Case(scheduler=True, optimizer="sgd"),
        "manual": rp.Case(layout="named", partitioner=Manual([["0.*", "4.*"], ["2.*", "6.*"]])),
        "flat-adam": rp.Case(partitioner=Flat()),
        "flat-bucket-groups": rp.Case(partitioner=Flat(), bucket_view=True, layout="groups"),
        "flat-sgd-closure": rp.Case(partitioner=Flat(), optimizer="sgd", closure=True),
        "flat-rmsprop-frozen": rp.Case(partitioner=Flat(), optimizer="rmsprop", frozen=(2,), unfreeze_at=5),
        "flat-adagrad": rp.Case(partitioner=Flat(), optimizer="adagrad"),
        "flat-adamw-groups-bucket": rp.Case(partitioner=Flat(), optimizer="adamw", layout="groups", bucket_view=True),
    }
)


@pytest.fixture(scope="module")
def results_w2(world):
    rows = world(rp.parity, 2, list(CASES.values()))
    return {name: [rank_rows[i] for rank_rows in rows] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_match_ddp_plus_plain_optimizer(results_w2, name):
    per_rank = results_w2[name]
    for row in per_rank:
        assert row["max_diff"] <= TOL, (name, row["max_diff"])
        assert row["zero_losses"] == pytest.approx(row["ref_losses"], abs=TOL)
    assert len({row["checksum"] for row in per_rank}) == 1, "replicas differ across ranks"


def test_adam_state_is_about_half_per_rank_at_w2(results_w2):
    for row in results_w2["adam-bucket0"]:
        bound = 0.5 * row["ref_state_bytes"] + row["largest_param_state_bytes"]
        assert row["state_bytes"] <= bound
    total = sum(row["state_bytes"] for row in results_w2["adam-bucket0"])
    assert total == pytest.approx(results_w2["adam-bucket0"][0]["ref_state_bytes"], rel=0.01)


def test_flat_state_is_exactly_its_range(results_w2):
    rows = results_w2["flat-adam"]
    sizes = [row["state_bytes"] for row in rows]
    assert max(sizes) - min(sizes) <= 2 * 4 + 8  # one element of exp_avg/exp_avg_sq + a step counter


def test_three_ranks(world):
    cases = [rp.Case(bucket_view=True), rp.Case(partitioner=Flat(), layout="groups"), rp.Case(optimizer="sgd")]
    for rank_rows in world(rp.parity, 3, cases):
        for row in rank_rows:
            assert row["max_diff"] <= TOL


@pytest.mark.parametrize("bucket_view", [False, True])
def test_same_owners_and_parameters_as_torch_zero(world, bucket_view):
    for row in world(rp.versus_torch, 2, bucket_view):
        assert row["owners_equal"]
        assert row["max_diff"] == 0.0


@pytest.mark.parametrize("partitioner", [None, Flat()], ids=["sorted_greedy", "flat"])
def test_consolidated_state_round_trips_through_zero_and_plain_adam(world, partitioner):
    for row in world(rp.checkpoint_round_trip, 2, partitioner):
        assert row["diffs"] == {"zero": 0.0, "plain": 0.0, "plain_then_zero": 0.0}
        assert row["state_keys"] == list(range(8))


def test_join_with_uneven_inputs_matches_ddp(world):
    for row in world(rp.uneven_join, 2, [3, 6]):
        assert row["max_diff"] <= TOL
