"""torchtitan's OptimizersContainer with the two-line zero_lab recipe (issue 28): trains, saves and
resumes through DCP bitwise like the plain container; its ``init_optim_state`` sees the state."""

from __future__ import annotations

from tests.clients.conftest import require, torchrun


def test_torchtitan_container_recipe_trains_and_resumes_like_adamw(tmp_path):
    require("torchtitan")
    result = torchrun("titan_container.py", tmp_path)
    assert result["zero_class"] == "ZeroRedundancyOptimizer"
    assert result["zero"] == result["adamw"]  # the save's init_optim_state did not step the ZeRO optimizer
    assert result["zero_resumed"] == result["adamw"]
    assert result["adamw_resumed"] == result["adamw"]
    assert result["ranks_agree"] is True
