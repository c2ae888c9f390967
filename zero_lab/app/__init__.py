"""The Hydra app behind ``train.py``: config schemas, checks, the rank loop, metrics, sinks.

    from zero_lab import app
    app.setup()                     # schemas + resolvers, before hydra.main / hydra.compose
    sys.argv = app.prepare(sys.argv)  # check the command, set up torchrun
    app.run(cfg)                    # inside @hydra.main: start ranks, train, report

Modules, one job each: ``schema`` (typed plain keys; group schemas derived from the
constructors), ``validate`` (builds and runs the real objects; ranges and combinations),
``preflight`` / ``cli`` (before Hydra starts), ``main`` (the Hydra task), ``build``
(model -> DDP -> optimizer), ``runner`` (the rank loop), ``data`` / ``models`` (synthetic tasks), ``metrics`` (one
gather per step), ``sinks`` (metrics.jsonl, W&B), ``checkpoint``, ``progress``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["prepare", "run", "setup"]


def setup() -> None:
    """Register the config schemas (idempotent; derived from the option YAMLs' targets)."""
    from zero_lab.app.schema import register_configs

    register_configs()


def prepare(argv: list[str]) -> list[str]:
    from zero_lab.app.cli import prepare as _prepare

    return _prepare(argv)


def run(cfg: Any) -> float:
    from zero_lab.app.main import run as _run

    return _run(cfg)
