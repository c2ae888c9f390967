"""Where rank 0's metrics go: ``metrics.jsonl`` always, plus the configured logger.

A sink is anything with ``log(record)``, ``summary(values)`` and ``close(failed)``
(:class:`MetricSink`). ``cfg.logger`` is a ``_partial_`` target completed at the call
site with the run dir, the resolved config and the sweep group::

    sink = instantiate(cfg.logger)(run_dir=run_dir, config=resolved, group=group)

:class:`WandbSink` imports wandb lazily and only on rank 0; offline mode needs no key and
no network, and everything (run files, wandb-core logs, cache) stays in the run dir.
``close`` always finishes the run and tears wandb-core down, so no process outlives the
rank.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

__all__ = ["JsonlSink", "MetricSink", "NullSink", "WandbSink"]


class MetricSink(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def close(self, failed: bool = False) -> None: ...


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class JsonlSink:
    """Appends one JSON object per logged step to ``path`` (flushed every line)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _finite(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self._file.close()


class NullSink:
    """``logger=none``: nothing beyond the run dir's own files."""

    def __init__(self, **_: Any):
        pass

    def log(self, record: dict[str, Any]) -> None:
        pass

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


class WandbSink:
    """A W&B run owned by rank 0, its files under ``<run_dir>/wandb/``."""

    def __init__(
        self,
        run_dir: str | Path,
        config: dict[str, Any],
        project: str = "zero_lab",
        mode: str = "offline",
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        job_type: str = "train",
        tags: list[str] | None = None,
        notes: str | None = None,
    ):
        run_dir = Path(run_dir)
        # wandb reads these at import / init: keep it quiet and keep its files in the run dir.
        os.environ["WANDB_SILENT"] = "true"
        os.environ["WANDB_CACHE_DIR"] = str(run_dir / "wandb" / ".cache")
        os.environ["WANDB_DATA_DIR"] = str(run_dir / "wandb" / ".data")
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        import wandb

        self._wandb = wandb
        self.run = wandb.init(
            dir=str(run_dir),
            project=project,
            entity=entity,
            mode=str(getattr(mode, "value", mode)),  # type: ignore[arg-type]
            name=name,
            group=group,
            job_type=job_type,
            tags=list(tags or []),
            notes=notes,
            config=config,
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(record)

    def summary(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if isinstance(value, (int, float, str, bool)):
                self.run.summary[key] = value

    def close(self, failed: bool = False) -> None:
        try:
            self.run.finish(exit_code=1 if failed else 0)
        finally:
            self._wandb.teardown()
