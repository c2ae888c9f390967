"""The step lives in the pipeline: ``optimizer.step -> pipeline``, ``overlap hook -> pipeline``.

Checked here (in-process one-rank group): the pipeline's step is the optimizer's (bitwise the
same update as plain Adam, hyper-parameters synced both ways, the local step timed); the names
that serve the overlap hooks and prefetch live on ``opt.pipeline`` only (the optimizer has no
attribute forwarding, so an unknown name is a plain ``AttributeError``); the overlap module reaches the
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


#: The names that serve only the overlap hooks and prefetch: the pipeline's, not the optimizer's.
PIPELINE_ONLY = (
    "attach_per_bucket",
    "step_bucket",
    "track_in_flight",
    "prefetching",
    "first_use",
    "start_prefetch",
    "stop_prefetch",
    "note_first_use",
    "exchange_units",
)
#: The spellings these had on the optimizer before they moved (never released): gone, not forwarded.
OLD_SPELLINGS = ("attach_ddp", "step_shards", "async_exchange", *PIPELINE_ONLY)


@pytest.mark.parametrize("name", OLD_SPELLINGS)
def test_the_optimizer_has_none_of_the_pipelines_names(single_rank_group, name):
    opt = ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, lr=1e-2)
    with pytest.raises(AttributeError, match=f"no attribute {name!r}"):
        getattr(opt, name)
    assert "__getattr__" not in vars(ZeroRedundancyOptimizer)


def test_the_pipelines_names_drive_the_pipeline(single_rank_group):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    pipeline = opt.pipeline
    pipeline.start_prefetch()
    assert pipeline.prefetching is True and pipeline.exchange_timing == "next_forward"
    pipeline.note_first_use([1, 0])
    assert pipeline.first_use._seen == {1: 0, 0: 1}
    pipeline.stop_prefetch()
    assert pipeline.prefetching is False and pipeline.exchange_timing == "after_step"
    shard = opt.local_shards()[0]
    before = shard.param.detach().clone()
    pipeline.step_bucket([(shard.tensor, torch.ones_like(shard.tensor))])  # one shard, one gradient
    assert not torch.equal(shard.param, before) and shard.tensor.grad is None
    assert pipeline.exchange_units == len(opt.partition.shards) == 4  # per shard: one broadcast each


def test_attach_per_bucket_runs_with_overlap_only(single_rank_group):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-2)
    opt.pipeline.attach_per_bucket({}, False)  # DDP's buckets, shard_buckets
    assert opt.pipeline.exchange_timing == "per_bucket" and opt.exchange_mode == "overlap_per_bucket"
    plain = ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, lr=1e-2)
    with pytest.raises(ValueError, match="build it with overlap_with_ddp=True"):
        plain.pipeline.attach_per_bucket({})


def test_an_attribute_error_inside_a_property_names_the_attribute_it_lacks(single_rank_group, monkeypatch):
    opt = ZeroRedundancyOptimizer(_model().parameters(), torch.optim.Adam, lr=1e-2)
    monkeypatch.delattr(opt.pipeline, "exchange")  # a property that reads it fails ...
    with pytest.raises(AttributeError, match="'exchange'"):  # ... naming what it lacks, not the property
        opt.exchange_mode  # noqa: B018


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
