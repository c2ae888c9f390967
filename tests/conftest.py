"""Fixtures every layer may use. Layer-specific ones live in ``unit/``, ``dist/`` and ``e2e/``.

- ``tests/unit``: no processes (an in-process one-rank group at most) — ``make check``.
- ``tests/dist``: worlds of Gloo ranks from one preloaded forkserver (``tests/dist/worlds.py``).
- ``tests/e2e``: the real ``python train.py``, single runs and sweeps (``tests/e2e/runs.py``).

``make test`` and ``make check`` run the suite on two pytest-xdist workers (``-n 2 --dist
loadgroup``): each test is put in a group (:func:`xdist_group_of`) that one worker runs whole, so a
module's or a shared session fixture is made once, never by both workers; the Slurm layer (mostly
waiting for slurmctld) runs beside the rest. Plain ``pytest`` runs in one process as before.
Known gap: this hook runs after xdist's own ``pytest_collection_modifyitems`` (which reads the
groups), so the groups do not take effect yet and tests are spread one by one; making it
``tryfirst`` is the next change, to be validated with a full run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: e2e modules that read the session's shared runs (``default_run``, ``sweep`` in tests/e2e/conftest.py):
#: one group, so those runs are made once.
SHARED_E2E_RUNS = {"test_app", "test_config_cli", "test_default_job", "test_metrics", "test_optuna", "test_report"}


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group ``item`` runs in: the Slurm layer as one (one cluster per session), the e2e
    modules of :data:`SHARED_E2E_RUNS` as one, every other module its own."""
    path = Path(str(item.path))
    layer = path.parent.name
    if layer == "slurm":
        return "slurm"
    if layer == "e2e" and path.stem in SHARED_E2E_RUNS:
        return "e2e-shared-runs"
    return f"{layer}/{path.stem}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))


@pytest.fixture(scope="session")
def single_rank_group() -> None:
    """An in-process world of one Gloo rank: enough to construct optimizers and check errors."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
