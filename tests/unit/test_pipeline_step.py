"""The step lives in the pipeline: ``optimizer.step -> pipeline``, ``overlap hook -> pipeline``.

Checked here (in-process one-rank group): the pipeline's step is the optimizer's (bitwise the
same update as plain Adam, hyper-parameters synced both ways, the local step timed); every
name that moved from the optimizer to ``opt.pipeline`` (:data:`zero_lab.optimizer.MOVED_TO_PIPELINE`)
still works under its old spelling and warns with the new one; the overlap module reaches the
optimizer only for its ``pipeline``; and the pipeline module imports neither the optimizer nor
the hooks (nothing calls back into the object that called it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import zero_lab
from zero_lab import ZeroRedundancyOptimizer
from zero_lab.optimizer import MOVED_TO_PIPELINE
from zero_lab.overlap import prefetch_exchange

PACKAGE_DIR = Path(zero_lab.__file__).parent


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


def _backward(model: nn.Module, step: int) -> None:
    model(torch.randn(4, 6, generator=torch.Generator().manual_seed(step))).pow(2).sum().backward()


def test_the_pipelines_step_is_the_optimizers_and_syncs_hyperparameters_both_ways(single_rank_group):
    model, reference = _model(), _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    assert opt.pipeline.groups is opt.param_groups  # read before each step, written back after
    for step in range(3):
        for module, optimizer in ((model, opt), (reference, plain)):
            optimizer.zero_grad()
            _backward(module, step)
            if step == 2:
                optimizer.param_groups[0]["lr"] = 1e-3  # a scheduler's change reaches the local optimizer
        if step == 1:
            opt.pipeline.step()  # what opt.step() runs, less torch's contract around it
        else:
            opt.step()
        plain.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    assert opt.optim.param_groups[0]["lr"] == 1e-3
    assert opt.local_step_seconds == opt.pipeline.local_step_seconds > 0


def test_param_groups_assigned_anew_are_the_ones_the_pipeline_steps_with(single_rank_group):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=1.0)
    opt.param_groups = [dict(group, lr=0.5) for group in opt.param_groups]  # as a client's wrapper may
    assert opt.pipeline.groups is opt.param_groups
    weight = model[0].weight
    before = weight.detach().clone()
    weight.grad = torch.ones_like(weight)
    opt.step()
    assert torch.equal(weight.detach(), before - 0.5)
    assert opt.optim.param_groups[0]["lr"] == 0.5


def test_the_optimizer_no_longer_has_the_moved_names_of_its_own():
    own = set(dir(ZeroRedundancyOptimizer))
    assert own.isdisjoint(MOVED_TO_PIPELINE)
    assert {"step_shards", "attach_ddp", "start_prefetch", "exchange_units"} <= set(MOVED_TO_PIPELINE)
    assert not {"_exchange_params", "_refresh_trainability", "_local_param_groups"} & own


@pytest.mark.parametrize("old", sorted(set(MOVED_TO_PIPELINE) - {"attach_ddp"}))
def test_each_moved_name_still_works_and_warns_with_its_new_spelling(single_rank_group, old):
    opt = ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, lr=1e-2)
    new = MOVED_TO_PIPELINE[old]
    with pytest.warns(DeprecationWarning, match=rf"ZeroRedundancyOptimizer\.{old} moved .*opt\.pipeline\.{new}$"):
        value = getattr(opt, old)
    expected = getattr(opt.pipeline, new)
    if callable(expected):
        assert value == expected  # the pipeline's bound method
    else:
        assert value is expected or value == expected


def test_the_old_names_drive_the_pipeline(single_rank_group, recwarn):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    opt.start_prefetch()
    assert opt.async_exchange is True and opt.pipeline.exchange_timing == "next_forward"
    opt.note_first_use([1, 0])
    opt.stop_prefetch()
    assert opt.pipeline.prefetching is False and opt.pipeline.exchange_timing == "after_step"
    shard = opt.local_shards()[0]
    before = shard.param.detach().clone()
    opt.step_shards([(shard.tensor, torch.ones_like(shard.tensor))])  # one shard, one gradient
    assert not torch.equal(shard.param, before) and shard.tensor.grad is None
    assert opt.exchange_units == opt.pipeline.exchange_units
    warned = {str(w.message).split(" moved")[0] for w in recwarn if w.category is DeprecationWarning}
    used = ("start_prefetch", "async_exchange", "note_first_use", "stop_prefetch", "step_shards", "exchange_units")
    assert warned == {f"ZeroRedundancyOptimizer.{name}" for name in used}


def test_attach_ddp_keeps_its_old_signature(single_rank_group):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-2)
    with pytest.warns(DeprecationWarning, match=r"opt\.pipeline\.attach_per_bucket$"):
        opt.attach_ddp(None, {}, False)  # the hook, DDP's buckets, shard_buckets
    assert opt.pipeline.exchange_timing == "per_bucket" and opt.exchange_mode == "overlap_per_bucket"
    plain = ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, lr=1e-2)
    with pytest.raises(ValueError, match="build it with overlap_with_ddp=True"):
        plain.pipeline.attach_per_bucket({})


def test_unknown_names_still_raise_attribute_error(single_rank_group):
    opt = ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, lr=1e-2)
    with pytest.raises(AttributeError, match="no attribute 'repartition'"):
        opt.repartition  # noqa: B018
    assert not hasattr(opt, "_async_exchange") and getattr(opt, "_first_use", None) is None


def test_prefetch_hooks_talk_to_the_pipeline(single_rank_group):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    handle = prefetch_exchange(model, opt)
    assert handle.pipeline is opt.pipeline and opt.pipeline.prefetching
    model(torch.zeros(1, 6))
    assert opt.pipeline.first_use._seen == {0: 0, 1: 1, 2: 2, 3: 3}  # noted by the pre-hooks, in forward order
    handle.remove()
    assert not opt.pipeline.prefetching


def _attributes_of(path: Path, name: str) -> set[str]:
    """Every ``<name>.<attribute>`` read in the module at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name
    }


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }


def test_the_hooks_reach_the_optimizer_only_for_its_pipeline_and_the_pipeline_calls_neither_back():
    assert _attributes_of(PACKAGE_DIR / "overlap.py", "zero") == {"pipeline", "overlap_with_ddp"}
    imported = _imports(PACKAGE_DIR / "pipeline.py")
    assert not imported & {"zero_lab.optimizer", "zero_lab.overlap", "zero_lab.grad_reduce"}
