"""The drop-in contract on real worlds: local groups, add_param_group, one exchange per element."""

from __future__ import annotations

import pytest

from tests import rank_programs as rp
from zero_lab import Flat


def test_every_global_group_has_a_local_group_even_if_empty(world):
    assert world(rp.local_group_shapes, 2) == [[2, 0], [1, 1]]


def test_add_param_group_keeps_owners_and_matches_plain_adam(world):
    for row in world(rp.add_group_mid_run, 2):
        assert row["max_diff"] <= 1e-6
        assert row["owners_after"][: len(row["owners_before"])] == row["owners_before"]
        assert row["local_groups"] == 2


@pytest.mark.parametrize(
    ("partitioner", "bucket_view", "mode", "calls"),
    [
        (None, False, "per_shard_broadcast", "per_param"),
        (None, True, "bucket_broadcast", 2),
        (Flat(), False, "flat_all_gather", 1),
        (Flat(), True, "flat_all_gather", 1),
    ],
)
def test_each_element_is_exchanged_once_per_step(world, partitioner, bucket_view, mode, calls):
    for row in world(rp.exchange_bytes, 2, partitioner, bucket_view):
        assert row["mode"] == mode
        assert row["calls"] == (row["num_params"] if calls == "per_param" else calls)
        padding = 4 * 2  # flat pads the buffer to a multiple of W elements
        assert row["model_bytes"] <= row["bytes"] <= row["model_bytes"] + padding
