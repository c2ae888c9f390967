"""HF Trainer runs zero_lab unchanged and bitwise (issue 28): train, save, resume under torchrun."""

from __future__ import annotations

from tests.clients.conftest import require, torchrun


def test_hf_trainer_trains_saves_and_resumes_like_adamw(tmp_path):
    require("transformers", "accelerate")
    result = torchrun("hf_trainer.py", tmp_path)
    assert result["zero_class"] == "ZeroRedundancyOptimizer"
    assert result["saved_state_equals_adamw"] is True  # optimizer.pt holds the full state, saved by rank 0 alone
    assert result["zero"] == result["adamw"]
    assert result["zero_resumed"] == result["adamw"]
    assert result["ranks_agree"] is True
