"""What the pre-start check says about a command line: the one helper the config tests share."""

from __future__ import annotations

from typing import Any

import pytest

from zero_lab.app.check.preflight import preflight
from zero_lab.app.check.rules import ConfigError


def problems(*overrides: str, **preflight_kwargs: Any) -> str:
    """The ``ConfigError`` text :func:`preflight` raises for ``overrides`` (fails if it accepts them)."""
    with pytest.raises(ConfigError) as caught:
        preflight(list(overrides), **preflight_kwargs)
    return str(caught.value)
