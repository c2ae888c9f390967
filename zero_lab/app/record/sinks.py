"""Where metrics go: ``metrics.jsonl`` (rank 0) always, plus the configured logger.

A sink is anything with ``log(record)``, ``summary(summary)`` and ``close(failed)``
(:class:`MetricSink`). ``cfg.logger`` is a ``_partial_`` target completed at the call site
(:func:`make_logger_sink`) with the run dir and the W&B run's config, each only if the sink's
constructor takes it: a sink of your own (``logger._target_=my_project.PrintSink``) declares
what it wants. With ranks started inside the Hydra job the job process runs the logger
(:class:`JsonlFollower`); under torchrun rank 0 logs directly. :class:`WandbSink` imports wandb
lazily, keeps its files in the run dir, and always tears wandb-core down: no process outlives the job.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hydra.utils import instantiate
from omegaconf import OmegaConf

from zero_lab.app.config.schema import HYDRA_KEYS, enum_str
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.record.summary import SUMMARY_FILE, RunSummary
from zero_lab.app.record.wandb_run import identity, run_config, run_summary
from zero_lab.files import finite_json

__all__ = ["JsonlFollower", "JsonlSink", "MetricSink", "NullSink", "WandbSink", "make_logger_sink"]


@runtime_checkable
class MetricSink(Protocol):
    """Where rank 0's per-step records go: ``log`` each record (``{"step": 3, "loss": ...}``),
    ``summary`` the run's :class:`RunSummary` once at the end, ``close`` always (``failed``: the
    run did not finish)."""

    def log(self, record: dict[str, Any]) -> None: ...

    def summary(self, summary: RunSummary) -> None: ...

    def close(self, failed: bool = False) -> None: ...


class JsonlSink:
    """Appends one JSON object per logged step to ``path`` (flushed every line)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(finite_json(record), allow_nan=False) + "\n")  # strict JSON: NaN -> null
        self._file.flush()

    def summary(self, summary: RunSummary) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self._file.close()


class NullSink:
    """``logger=none``: nothing beyond the run dir's own files."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def summary(self, summary: RunSummary) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


class LoggerMode(str, enum.Enum):
    """``wandb.init(mode=...)``: offline needs no key and no network; ``wandb sync`` later."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


class WandbSink:
    """A W&B run owned by rank 0, its files under ``<run_dir>/wandb/``."""

    def __init__(
        self,
        run_dir: str | Path,
        config: dict[str, Any],
        project: str = "zero_lab",
        mode: LoggerMode = LoggerMode.offline,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        job_type: str = "train",
        tags: list[str] | None = None,
        notes: str | None = None,
        init_timeout_s: float = 30.0,
    ):
        run_dir = Path(run_dir)
        # wandb reads these at import / init: keep it quiet and keep its files in the run dir.
        os.environ["WANDB_SILENT"] = "true"
        os.environ["WANDB_CACHE_DIR"] = str(run_dir / "wandb" / ".cache")
        os.environ["WANDB_DATA_DIR"] = str(run_dir / "wandb" / ".data")
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        import wandb

        self._wandb = wandb
        self.run = _init_with_fallback(
            wandb,
            enum_str(mode),
            init_timeout_s,
            dir=str(run_dir),
            project=project,
            entity=entity,
            name=name,
            group=group,
            job_type=job_type,
            tags=list(tags or []),
            notes=notes,
            config=config,
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(record)

    def summary(self, summary: RunSummary) -> None:
        self.run.summary.update(run_summary(summary))  # one record, not one per key
        if summary.exchange:  # the exchange zero_lab chose (exchange=auto) and its timings
            self.run.config.update({"exchange_report": summary.exchange}, allow_val_change=True)

    def close(self, failed: bool = False) -> None:
        sync_dir = str(self.run.settings.sync_dir)
        offline = f" (offline): {sync_dir}\n  upload it with: wandb sync {sync_dir}"
        line = f"zero_lab: W&B run{offline if self.run.offline else f': {self.run.url}'}"
        try:
            self.run.finish(exit_code=1 if failed else 0)
        finally:
            self._wandb.teardown()
        print(line, flush=True)


def _init_with_fallback(wandb: Any, mode: str, init_timeout_s: float, **init: Any) -> Any:
    """``wandb.init`` bounded by ``init_timeout_s`` (``logger.init_timeout_s``); an online run
    that cannot reach the server in time (no network, server down, bad key) falls back to
    offline with one notice on stderr, so training goes on and ``wandb sync`` can upload later."""

    def settings() -> Any:
        return wandb.Settings(console="off", x_disable_stats=True, silent=True, init_timeout=init_timeout_s)

    if mode != "online":
        return wandb.init(mode=mode, settings=settings(), **init)
    try:
        return wandb.init(mode="online", settings=settings(), **init)
    except (wandb.errors.Error, OSError) as error:  # CommError, UsageError, AuthenticationError; TimeoutError
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        print(
            f"zero_lab: W&B online init failed within logger.init_timeout_s={init_timeout_s:g} ({reason}); "
            f"logging offline to {init['dir']}/wandb instead (upload later with `wandb sync`)",
            file=sys.stderr,
            flush=True,
        )
        wandb.teardown()
        return wandb.init(mode="offline", settings=settings(), **init)


def make_logger_sink(
    cfg: Any, run_dir: str | Path, config: dict[str, Any], meta: dict[str, Any], plan: OptimPlan
) -> MetricSink:
    """Build ``cfg.logger`` (a ``_partial_`` target) for this run: group, name and tags from
    the sweep (:func:`~zero_lab.app.record.wandb_run.identity`) and the filterable run config
    (:func:`~zero_lab.app.record.wandb_run.run_config`)."""
    logger_cfg = OmegaConf.to_container(cfg.logger, enum_to_str=True)
    assert isinstance(logger_cfg, dict)
    logger_cfg = identity(logger_cfg, meta, cfg.dist.world_size, plan.zero)
    used = {k: v for k, v in logger_cfg.items() if k not in HYDRA_KEYS}
    make = instantiate(logger_cfg)
    supplied = {"run_dir": lambda: str(run_dir), "config": lambda: run_config(config, meta.get("choices", {}), used)}
    parameters = inspect.signature(make).parameters  # what the sink's constructor takes, named or by **kwargs
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return make(**{key: value() for key, value in supplied.items() if takes_any or key in parameters})


class JsonlFollower:
    """Forwards rank 0's ``metrics.jsonl`` to a sink from a thread of the *job* process.

    Why not log from rank 0: ``wandb.Run.log`` costs ≈ 0.7 ms of Python per call, and a thread
    in rank 0 would take the GIL from the training loop, while the job process is idle while its
    ranks train. The thread opens the sink (``make_sink``) while the ranks start and polls the
    file; :meth:`close` drains it, adds ``summary.json`` and closes the sink — also when a rank
    failed and the ranks were killed, so the W&B run is finished either way.

        with JsonlFollower(run_dir / METRICS_FILE, make_sink):
            run_world(...)
    """

    POLL_S = 0.25

    def __init__(self, path: str | Path, make_sink: Any):
        self.path = Path(path)
        self._make_sink = make_sink
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._sink: MetricSink | None = None
        self._offset = 0
        self._thread = threading.Thread(target=self._follow, name="zero_lab-metrics", daemon=True)

    def __enter__(self) -> JsonlFollower:
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(failed=exc_type is not None)

    def _follow(self) -> None:
        try:
            self._sink = self._make_sink()
            while not self._stop.wait(self.POLL_S):
                self._forward()
        except BaseException as error:  # user code: the metric sink's (W&B's) errors, re-raised by close()
            self._error = error

    def _forward(self) -> None:
        """Log every complete line appended since the last call (a partial last line waits)."""
        if self._sink is None or not self.path.exists():
            return
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            if line.strip():
                self._sink.log(json.loads(line))

    def close(self, failed: bool = False) -> None:
        self._stop.set()
        self._thread.join()
        if self._sink is None:
            if self._error is not None and not failed:
                raise RuntimeError(f"metrics logger could not start: {self._error}") from self._error
            return
        try:
            if self._error is None:
                self._forward()
                summary = self.path.with_name(SUMMARY_FILE)
                if summary.exists():  # written by rank 0 at the end, also of a run stopped by a signal
                    self._sink.summary(RunSummary.read(summary))
        finally:
            self._sink.close(failed=failed or self._error is not None)
        if self._error is not None and not failed:
            raise RuntimeError(f"metrics logger failed: {self._error}") from self._error
