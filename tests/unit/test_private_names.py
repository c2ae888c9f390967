"""The table of other libraries' private names (:mod:`zero_lab.private_names`) is complete and true.

Complete: the whole package's source is read with ``ast`` and every use of a private name that
zero_lab does not define itself — an attribute, a ``getattr`` of a literal name, an import from a
private module, a private module named in a string — is a row of the table, and every row is
still used. True: each name exists in the installed release and does what zero_lab relies on
(checked below, one check per row), so a release that changes one fails here by name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import zero_lab
from zero_lab.private_names import PRIVATE_NAMES

PACKAGE_DIR = Path(zero_lab.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    """``_x`` but not ``__x__`` (dunder) nor ``_x_`` (Hydra's public config keys: ``_target_``)."""
    return name.startswith("_") and not name.startswith("__") and not re.fullmatch(r"_[a-z]+_", name)


def _defined_by_zero_lab(trees: dict[str, ast.Module]) -> set[str]:
    """Every name zero_lab defines: functions, classes, variables, arguments, its own attributes."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return names


def private_uses(trees: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """``(module, token)`` for every use of another library's private name in ``trees``."""
    own = _defined_by_zero_lab(trees)
    found: set[tuple[str, str]] = set()
    for module, tree in trees.items():
        in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            if id(node) in in_fstrings:
                continue  # a piece of an f-string ("{group}_schema") names nothing
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.add((module, node.attr))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] in ("zero_lab", "__future__"):
                    continue
                private_at = next((i for i, part in enumerate(parts) if _private(part)), None)
                if private_at is not None:
                    found.add((module, ".".join(parts[: private_at + 1])))
                found.update((module, alias.name) for alias in node.names if _private(alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    private_at = next((i for i, part in enumerate(parts) if _private(part)), None)
                    if private_at is not None and parts[0] != "zero_lab":
                        found.add((module, ".".join(parts[: private_at + 1])))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and node.args[1].value not in own
            ):
                found.add((module, node.args[1].value))
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"[a-z]+(\.\w+)*\._[a-z]\w*(\.\w+)*", node.value)
                and node.value.split(".")[0] != "zero_lab"
            ):
                found.add((module, node.value))  # a private module named: preloaded, refused, allowed
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"_[A-Za-z]\w*", node.value)
                and _private(node.value)
                and node.value not in own
            ):
                found.add((module, node.value))  # a private name spelled as a string (an allowed pickle global)
    return found


def _package_trees() -> dict[str, ast.Module]:
    """Every module of the package but the table itself (which names them all)."""
    paths = sorted(PACKAGE_DIR.rglob("*.py"))
    return {_module_name(p): ast.parse(p.read_text()) for p in paths if _module_name(p) != "zero_lab.private_names"}


def test_every_private_name_the_package_uses_is_in_the_table_and_every_row_is_used():
    used = private_uses(_package_trees())
    listed = {(module, token) for row in PRIVATE_NAMES for module in row.modules for token in row.tokens}
    assert not used - listed, (
        f"private names of other libraries used but not in zero_lab/private_names.py: {sorted(used - listed)}; "
        "use a public API, or add a row (why, and a check in tests/unit/test_private_names.py)"
    )
    assert not listed - used, f"rows of zero_lab/private_names.py no longer used (remove them): {sorted(listed - used)}"


def test_the_scan_finds_each_kind_of_use():
    source = """
import torch
from hydra._internal import defaults_list
def f(ddp, self):
    self._mine = 1
    return torch.autograd.Variable._execution_engine, getattr(ddp, "_bucket_config"), self._mine, "torch._dynamo"
"""
    found = private_uses({"m": ast.parse(source)})
    assert found == {
        ("m", "hydra._internal"),
        ("m", "_execution_engine"),
        ("m", "_bucket_config"),
        ("m", "torch._dynamo"),
    }


# ---------------------------------------------------------------- each name still there, still as relied on
def _queue_callback() -> None:
    ran: list[bool] = []
    x = torch.ones(3, requires_grad=True)

    def hook(grad: torch.Tensor) -> torch.Tensor:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: ran.append(x.grad is not None))
        return grad

    y = x * 2
    y.register_hook(hook)
    y.sum().backward()
    assert ran == [True]  # once, at the end of backward: after the leaf's gradient was accumulated


def _default_store() -> None:
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    assert isinstance(store, dist.Store)
    store.set("zero_lab/private_names", "ok")
    assert store.get("zero_lab/private_names") == b"ok"


def _bucket_config() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zero_lab.ddp_buckets import DdpBuckets

    ddp = DDP(nn.Linear(4, 4), bucket_cap_mb=3)
    assert isinstance(ddp._bucket_config.first_bucket_bytes_cap, int)
    assert DdpBuckets.from_ddp(ddp).first_bucket_cap_bytes == ddp._bucket_config.first_bucket_bytes_cap
    assert DdpBuckets.from_ddp(ddp).bucket_cap_bytes == ddp.bucket_bytes_cap == 3 * 2**20


def _bucket_capacity_config() -> None:
    from torch.nn.parallel import distributed

    parameters = inspect.signature(distributed._BucketCapacityConfig.create).parameters
    assert {"bucket_cap_mb", "bucket_cap_mb_list", "use_python_reducer"} <= set(parameters)
    config = distributed._BucketCapacityConfig.create(
        bucket_cap_mb=5, bucket_cap_mb_list=None, use_python_reducer=False
    )
    assert config.bucket_bytes_cap == 5 * 2**20 and isinstance(config.first_bucket_bytes_cap, int)


def _get_fqns() -> None:
    from torch.distributed.checkpoint.state_dict import _get_fqns
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = nn.Sequential(nn.Linear(2, 2))
    assert _get_fqns(model, "0.weight") == {"0.weight"}
    assert _get_fqns(DDP(model), "module.0.weight") == {"0.weight"}  # DDP's prefix stripped


def _dynamo_counters() -> None:
    counters = importlib.import_module("torch._dynamo.utils").counters
    assert isinstance(counters["stats"]["unique_graphs"], int)


def _dynamo_module() -> None:
    assert importlib.import_module("torch._dynamo").__name__ == "torch._dynamo"


def _logging_module() -> None:
    assert importlib.import_module("torch._logging").__name__ == "torch._logging"


def _forkserver() -> None:
    from multiprocessing import forkserver

    server = forkserver._forkserver
    assert isinstance(server, forkserver.ForkServer)
    assert hasattr(server, "_forkserver_pid") and hasattr(server, "_forkserver_alive_fd")


def _scheduler_state() -> None:
    from torch.optim.lr_scheduler import ConstantLR, LinearLR, SequentialLR

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    chained = SequentialLR(opt, [LinearLR(opt, 0.5, total_iters=2), ConstantLR(opt, 1.0)], milestones=[2])
    saved = chained.state_dict()["_schedulers"]
    assert isinstance(saved, list) and len(saved) == 2 and all(isinstance(state, dict) for state in saved)


def _dcp_pickle_globals() -> None:
    import pickle
    from pathlib import PurePosixPath

    from torch.distributed.checkpoint import filesystem, metadata

    assert isinstance(metadata._MEM_FORMAT_ENCODING, type)  # an enum DCP pickles by name
    assert dataclasses_fields(filesystem._StorageInfo) >= {"relative_path", "offset", "length"}
    assert torch.serialization._get_layout("torch.strided") is torch.strided  # how a layout unpickles
    pickled = pickle.dumps(PurePosixPath("a"))
    assert b"pathlib" in pickled  # PurePosixPath pickles as pathlib's (pathlib._local from Python 3.13)


def dataclasses_fields(cls: type) -> set[str]:
    import dataclasses

    return {field.name for field in dataclasses.fields(cls)}


def _foreach() -> None:
    a, b = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 5.0])
    assert [n.item() for n in torch._foreach_norm([a, b], 2.0)] == [5.0, 5.0]
    torch._foreach_mul_([a, b], torch.tensor(0.5))
    assert a.tolist() == [1.5, 2.0] and b.tolist() == [0.0, 2.5]


def _os_exit() -> None:
    import os

    assert list(inspect.signature(os._exit).parameters) == ["status"]


CHECKS: dict[str, Callable[[], None]] = {
    "torch.autograd.Variable._execution_engine.queue_callback": _queue_callback,
    "torch.distributed.distributed_c10d._get_default_store": _default_store,
    "torch.nn.parallel.DistributedDataParallel._bucket_config": _bucket_config,
    "torch.nn.parallel.distributed._BucketCapacityConfig": _bucket_capacity_config,
    "torch.distributed.checkpoint.state_dict._get_fqns": _get_fqns,
    "torch._dynamo.utils.counters": _dynamo_counters,
    "torch._dynamo": _dynamo_module,
    "torch._logging": _logging_module,
    "multiprocessing.forkserver._forkserver": _forkserver,
    "multiprocessing.forkserver.ForkServer._forkserver_pid": _forkserver,
    "multiprocessing.forkserver.ForkServer._forkserver_alive_fd": _forkserver,
    "os._exit": _os_exit,
    "torch._foreach_norm, torch._foreach_mul_": _foreach,
    "torch.optim.lr_scheduler.SequentialLR._schedulers": _scheduler_state,
    "DCP .metadata pickle globals": _dcp_pickle_globals,
}


def test_every_row_has_a_check_and_a_reason():
    assert {row.name for row in PRIVATE_NAMES} == set(CHECKS)
    assert all(row.why and row.modules and row.tokens for row in PRIVATE_NAMES)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_private_name_still_exists_and_behaves_as_relied_on(name, single_rank_group):
    CHECKS[name]()
