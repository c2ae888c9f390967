"""Fixtures every layer may use. Layer-specific ones live in ``unit/``, ``dist/`` and ``e2e/``.

- ``tests/unit``: no processes (an in-process one-rank group at most) — ``make check``.
- ``tests/dist``: worlds of Gloo ranks from one preloaded forkserver (``tests/dist/worlds.py``).
- ``tests/e2e``: the real ``python train.py``, single runs and sweeps (``tests/e2e/runs.py``).

``make test`` runs the suite on three pytest-xdist workers (``-n 3``; ``make check`` the unit
layer on two) with this folder's scheduler (:func:`pytest_xdist_make_scheduler`): each test of the
dist, e2e and Slurm layers belongs to a group (:func:`xdist_group_of`) that one worker runs whole,
so a module's fixtures are made once, never by two workers; unit tests are spread one by one. The
e2e runs several modules read (``default_run``, ``sweep``, ...: tests/e2e/conftest.py) are made once
per session by whichever worker asks first, under a lock the others wait on
(:func:`tests.e2e.runs.runs_once`), so those modules need no common group: each is its own, and
the workers share them out. (xdist's own ``--dist loadgroup`` reads ``xdist_group`` markers into node ids
that pytest 9 no longer uses, so here the groups come from each test's path instead.) Groups are
handed out longest first (:data:`LAYER_ORDER`: the Slurm layer, which mostly waits for slurmctld
and its jobs, then the e2e runs of ``train.py``, then the Gloo worlds), the many short unit tests
last, to fill the workers' ends. That is why there is a third worker on two cores: while one
waits for Slurm, two compute. Plain ``pytest`` runs in one process, in collection order.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest

#: Unit tests that build a ``transformers`` model (their node ids hold one of these): one group, so
#: one worker pays transformers' first model import (about 5 s of CPU: torch._dynamo, sympy, DTensor),
#: not each. Found by running the layer with ``transformers`` dropped from ``sys.modules`` before each test.
BUILDS_TRANSFORMERS = (
    "gpt2",
    "llama",
    "transformers",
    "[data-text]",  # test_config: data=text runs with model=gpt2
)


#: Unit modules whose tests share one cached parse of the whole package (``ast``): one worker each.
UNIT_MODULES_WHOLE = {"test_facts_once", "test_layers"}


def xdist_group_of(nodeid: str) -> str:
    """The group the test ``nodeid`` runs in: the Slurm layer as one (one cluster per session, its
    jobs queued one after another), every dist or e2e module its own, and each unit test alone (no
    shared fixture worth a group) but those that build a transformers model
    (:data:`BUILDS_TRANSFORMERS`) and the modules of :data:`UNIT_MODULES_WHOLE`."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    layer = path.parent.name
    if layer == "slurm":
        return "slurm"
    if layer == "unit":
        if any(mark in nodeid for mark in BUILDS_TRANSFORMERS):
            return "unit/transformers"
        return f"unit/{path.stem}" if path.stem in UNIT_MODULES_WHOLE else nodeid
    return f"{layer}/{path.stem}"


#: The order groups are handed to workers: longest first (LPT), the unit layer's short tests last.
LAYER_ORDER = {"slurm": 0, "e2e": 1, "dist": 2, "unit": 3}


#: Within their layer, the modules that make the most ``train.py`` runs go first, longest first (their
#: setup and call times in the clean-clone runs of ``make test``, 2026-11-27): one of them handed out
#: last would bound the wall time alone while the other workers idle.
HEAVY_FIRST = (
    "test_app",
    "test_faults",
    "test_app_faults",
    "test_loop_features",
    "test_engine_resume",
    "test_app_precision",
    "test_core_doc",
    "test_own_docs",
    "test_hierarchy_app",
    "test_report",
    "test_two_nodes_link",
    "test_optuna",
)


def schedule_key(item: pytest.Item) -> tuple[int, int]:
    """Where ``item``'s layer comes in :data:`LAYER_ORDER` (unknown folders just before unit), then
    its module in :data:`HEAVY_FIRST` (the rest after those, in collection order)."""
    path = Path(str(item.path))
    layer = LAYER_ORDER.get(path.parent.name, len(LAYER_ORDER) - 1)
    return layer, HEAVY_FIRST.index(path.stem) if path.stem in HEAVY_FIRST else len(HEAVY_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike, the scheduler reads this order
        items.sort(key=schedule_key)  # stable: within a layer, collection order


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler (in collection order, no reordering by size) over :func:`xdist_group_of`."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    config.option.loadscopereorder = False
    return ByGroup(config, log)


@pytest.fixture(scope="session")
def single_rank_group() -> None:
    """An in-process world of one Gloo rank: enough to construct optimizers and check errors."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
