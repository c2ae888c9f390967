"""The phase modules are phases of the step pipeline: they take the pipeline (or less) and
reach nothing above it.

``zero_lab.grad_reduce`` (gradients to their owners), ``zero_lab.exchange`` (parameters back to
every rank) and ``zero_lab.collectives`` (what the exchange moves them with) import neither the
optimizer nor the overlap hooks, at any depth; and the gradient phase reads nothing of the
optimizer it is installed for but its ``pipeline``. Read from the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import zero_lab

PACKAGE_DIR = Path(zero_lab.__file__).parent
PHASES = ("grad_reduce", "exchange", "collectives")
ABOVE = {"zero_lab.optimizer", "zero_lab.overlap"}


def imported(tree: ast.Module) -> set[str]:
    """Every module named by an import anywhere in ``tree`` (``from a import b``: ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def optimizer_reads(tree: ast.Module, name: str) -> set[str]:
    """The attributes read of the variable ``name``: ``name.x`` and ``getattr(name, "x")``."""
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
            reads.add(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == name
        ):
            reads.add(ast.literal_eval(node.args[1]))
    return reads


def tree_of(module: str) -> ast.Module:
    return ast.parse((PACKAGE_DIR / f"{module}.py").read_text())


@pytest.mark.parametrize("phase", PHASES)
def test_no_phase_module_imports_the_optimizer_or_the_overlap_hooks(phase):
    assert not imported(tree_of(phase)) & ABOVE


def test_the_gradient_phase_reads_only_the_optimizers_pipeline():
    tree = tree_of("grad_reduce")
    assert optimizer_reads(tree, "optimizer") == {"pipeline"}
    for other in ("zero", "opt"):  # the names the optimizer went by before
        assert optimizer_reads(tree, other) == set()


def test_the_checks_catch_what_they_look_for():
    tree = ast.parse(
        "def f(zero):\n    from zero_lab.overlap import x\n    return zero.partition, getattr(zero, 'rank')"
    )
    assert imported(tree) & ABOVE == {"zero_lab.overlap"}
    assert optimizer_reads(tree, "zero") == {"partition", "rank"}
