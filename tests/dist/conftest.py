"""The ``world`` fixture: run a rank program on W Gloo ranks (see ``worlds.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.dist.worlds import run_ranks


@pytest.fixture(scope="session")
def world() -> Callable[..., list[Any]]:
    return run_ranks
