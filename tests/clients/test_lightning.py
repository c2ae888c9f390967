"""PyTorch Lightning runs zero_lab unchanged and bitwise (issue 28): fit, checkpoint, resume."""

from __future__ import annotations

from tests.clients.conftest import require, torchrun


def test_lightning_fits_checkpoints_and_resumes_like_adamw(tmp_path):
    require("pytorch_lightning")
    result = torchrun("lightning_loop.py", tmp_path)
    for optimizer in ("zero", "zero_flat_bucket_view"):
        assert result[optimizer] == result["adamw"], optimizer
        assert result[f"{optimizer}_resumed"] == result["adamw"], optimizer
    assert result["adamw_resumed"] == result["adamw"]
    assert result["ranks_agree"] is True
