"""Plain DDP vs ZeRO as one typed object (zero_lab/app/plan/strategy.py): what each answers on a
real one-rank group, and that no app module branches on a ``zero`` flag instead of asking it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import zero_lab.app
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.app.plan.strategy import PlainDdp, Strategy, Zero

APP_DIR = Path(zero_lab.app.__file__).parent


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _backward(model: nn.Module) -> None:
    model(torch.ones(3, 4)).square().sum().backward()


def test_each_strategy_is_chosen_by_what_the_optimizer_does_with_its_state(single_rank_group):
    model = _model()
    assert isinstance(Strategy.of(zero=False), PlainDdp) and isinstance(Strategy.of(zero=True), Zero)
    assert Strategy.of_optimizer(torch.optim.Adam(model.parameters())) is Strategy.of(False)
    zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    assert Strategy.of_optimizer(zero) is Strategy.of(True)
    assert (PlainDdp.unused_keys, Zero.unused_keys) == (("partitioner", "bucket_view"), ())
    assert Strategy.of(False).checkpoint_path("run", 7) == Path("run/checkpoints/step_00000007.pt")
    assert Strategy.of(True).checkpoint_path("run", 7) == Path("run/checkpoints/step_00000007")
    with pytest.raises(TypeError, match="steps a ZeroRedundancyOptimizer, not Adam"):
        Strategy.of(True).local_optimizer(torch.optim.Adam(model.parameters()))


def test_both_clip_to_the_same_global_norm_and_hold_state_after_a_step(single_rank_group):
    plain_model, zero_model = _model(), _model()
    plain = torch.optim.Adam(plain_model.parameters(), lr=1e-3)
    zero = ZeroRedundancyOptimizer(zero_model.parameters(), torch.optim.Adam, lr=1e-3)
    for model in (plain_model, zero_model):
        _backward(model)
    expected = torch.cat([p.grad.flatten() for p in plain_model.parameters()]).norm()  # the global 2-norm
    assert float(expected) > 0.5
    assert float(PlainDdp().clip_grad_norm(plain_model, plain, 0.5)) == pytest.approx(float(expected))
    assert float(Zero().clip_grad_norm(zero_model, zero, 0.5)) == pytest.approx(float(expected))
    for p, q in zip(plain_model.parameters(), zero_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert PlainDdp().params_with_state(plain) == [False] * 4 == Zero().params_with_state(zero)
    plain.step()
    zero.step()
    Zero().settle(zero)
    assert PlainDdp().params_with_state(plain) == [True] * 4 == Zero().params_with_state(zero)
    assert PlainDdp().local_optimizer(plain) is plain and Zero().local_optimizer(zero) is zero.optim
    assert PlainDdp().group_classes(plain) == Zero().group_classes(zero) == [torch.optim.Adam]
    assert (PlainDdp().imbalance(plain), PlainDdp().partition_report(plain), PlainDdp().exchange_report(plain)) == (
        1.0, None, None)  # fmt: skip
    assert Zero().partition_report(zero)["numel_per_rank"] == [sum(p.numel() for p in zero_model.parameters())]
    assert Zero().imbalance(zero) == 1.0 and Zero().exchange_mode(zero) == zero.exchange_mode


def _zero_tests(node: ast.AST) -> list[ast.AST]:
    """``x.zero`` (or a name ``zero``) read as a condition: ``if``/``elif``, ``a if zero else b``,
    ``and``/``or``/``not`` operands."""
    tests: list[ast.AST] = []
    for sub in ast.walk(node):
        if isinstance(sub, (ast.If, ast.IfExp, ast.While)):
            tests.append(sub.test)
        elif isinstance(sub, ast.BoolOp):
            tests.extend(sub.values)
        elif isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not):
            tests.append(sub.operand)
    return [
        t
        for test in tests
        for t in ast.walk(test)
        if (isinstance(t, ast.Attribute) and t.attr == "zero") or (isinstance(t, ast.Name) and t.id == "zero")
    ]


def test_no_app_module_branches_on_a_zero_flag():
    found = sorted(
        {
            f"{path.relative_to(APP_DIR)}:{hit.lineno}"
            for path in APP_DIR.rglob("*.py")
            if path.name != "strategy.py"
            for hit in _zero_tests(ast.parse(path.read_text()))
        }
    )
    assert found == [], f"ask the run's Strategy (zero_lab/app/plan/strategy.py) instead: {found}"
    assert _zero_tests(ast.parse("x = 1 if training.zero else 2\nif not zero: pass")) != []
