"""accelerate runs zero_lab unchanged and bitwise (issue 28): prepare, save_state, load_state,
with bucket views too (safetensors, accelerate's default model format)."""

from __future__ import annotations

from tests.clients.conftest import require, torchrun


def test_accelerate_saves_and_loads_state_like_adamw(tmp_path):
    require("accelerate", "safetensors")
    result = torchrun("accelerate_loop.py", tmp_path)
    for optimizer in ("zero", "zero_bucket_view"):
        assert result[optimizer] == result["adamw"], optimizer
        assert result[f"{optimizer}_resumed"] == result["adamw"], optimizer
        assert "model.safetensors" in result[f"{optimizer}_files"]
    assert result["adamw_resumed"] == result["adamw"]
    assert result["ranks_agree"] is True
