"""Where the project lives, and the ``${zero_lab.root:}`` resolver the run dirs use.

Runs land under ``<project>/outputs/`` whatever the working directory, so
``python ~/zero_lab/train.py`` and a test started from elsewhere both write to the place
the README describes (override ``hydra.run.dir=...`` / ``hydra.sweep.dir=...`` to move them).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

__all__ = ["CONF_DIR", "PROJECT_ROOT", "register_resolvers"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"


def register_resolvers() -> None:
    """Register ``${zero_lab.root:}`` (idempotent)."""
    if not OmegaConf.has_resolver("zero_lab.root"):
        OmegaConf.register_new_resolver("zero_lab.root", lambda: str(PROJECT_ROOT))
