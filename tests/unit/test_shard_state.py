"""Cutting optimizer state into element ranges and gluing it back is exact."""

import torch

from zero_lab.shard_state import merge_states, slice_state


def test_slice_then_merge_is_identity():
    shape = (4, 3)
    full = {"exp_avg": torch.randn(shape), "exp_avg_sq": torch.rand(shape), "step": torch.tensor(7.0)}
    cuts = [(0, 5), (5, 6), (6, 12)]
    pieces = [((a, b), slice_state(full, shape, a, b)) for a, b in cuts]
    assert pieces[1][1]["exp_avg"].shape == (1,)
    assert pieces[1][1]["step"] is full["step"]
    merged = merge_states(list(reversed(pieces)), shape)
    assert torch.equal(merged["exp_avg"], full["exp_avg"])
    assert torch.equal(merged["exp_avg_sq"], full["exp_avg_sq"])
    assert merged["step"].item() == 7.0


def test_full_range_keeps_parameter_shape():
    full = {"momentum_buffer": torch.randn(2, 2)}
    assert slice_state(full, (2, 2), 0, 4)["momentum_buffer"].shape == (2, 2)


def test_slices_are_copies_not_views():
    full = {"exp_avg": torch.zeros(6)}
    piece = slice_state(full, (6,), 2, 4)
    piece["exp_avg"].add_(1)
    assert full["exp_avg"].sum() == 0


def test_reslice_moves_state_between_any_two_partitions():
    """Saved at cuts (0,5,12), wanted at cuts (0,3,8,12): every wanted piece is exact."""
    from zero_lab.shard_state import reslice

    shape = (4, 3)
    full = {"exp_avg": torch.arange(12.0).reshape(shape), "step": torch.tensor(2.0)}
    saved = [((a, b), slice_state(full, shape, a, b)) for a, b in ((0, 5), (5, 12))]
    for a, b in ((0, 3), (3, 8), (8, 12)):
        piece = reslice(saved, shape, (a, b))
        assert torch.equal(piece["exp_avg"], torch.arange(float(a), float(b)))
        assert piece["step"].item() == 2.0
    assert torch.equal(reslice(saved, shape, (0, 12))["exp_avg"], full["exp_avg"])


def test_reslice_refuses_a_gap():
    import pytest

    from zero_lab.shard_state import reslice

    piece = slice_state({"m": torch.zeros(6)}, (6,), 0, 2)
    with pytest.raises(ValueError, match="covers 2 of the 4 elements"):
        reslice([((0, 2), piece)], (6,), (0, 4))
