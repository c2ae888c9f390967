"""The overlap hooks and the checkpoint code use the optimizer's shard API, never its private members.

Read from the source with ``ast``: every ``<expr>.<name>`` in ``zero_lab/overlap.py`` and
``zero_lab/checkpoint.py`` whose ``<expr>`` is not ``self`` (the module's own classes) is
checked against the private names a ``ZeroRedundancyOptimizer`` has (its class's and
``torch.optim.Optimizer``'s, and an instance's attributes).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import zero_lab
from zero_lab import ZeroRedundancyOptimizer

PACKAGE_DIR = Path(zero_lab.__file__).parent


def _private(names: object) -> set[str]:
    return {name for name in names if name.startswith("_") and not name.endswith("__")}


def _is_named_access(node: ast.AST) -> bool:
    """``getattr(x, "name", ...)``, ``setattr(x, "name", v)`` or ``hasattr(x, "name")``."""
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    )


def _foreign_attributes(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every attribute read or written on something other than ``self``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            found.append((node.lineno, node.attr))
        elif _is_named_access(node):
            found.append((node.lineno, node.args[1].value))
    return found


@pytest.mark.parametrize("module", ["overlap.py", "checkpoint.py"])
def test_no_private_member_of_the_optimizer_is_used(single_rank_group, module):
    opt = ZeroRedundancyOptimizer([torch.nn.Parameter(torch.ones(3))], torch.optim.Adam, lr=1e-3)
    private = _private(dir(ZeroRedundancyOptimizer)) | _private(vars(opt))
    assert {"_exchange", "_optim", "_comm", "_partitioner"} <= private  # the scan knows what to look for
    used = [(line, name) for line, name in _foreign_attributes(PACKAGE_DIR / module) if name in private]
    assert used == [], f"{module} reaches into ZeroRedundancyOptimizer's private members: {used}"
