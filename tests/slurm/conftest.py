"""The Slurm layer: a real cluster (munged, slurmctld, two slurmd nodes in network namespaces),
once per session, for the tests in this folder (:mod:`tests.slurm.cluster`).

Skipped, with a line saying how to enable it, where the binaries or root are missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
