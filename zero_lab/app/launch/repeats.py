"""A sweep job that would repeat an earlier one is not run again.

A plain optimizer ignores ``partitioner`` and ``bucket_view``, so in ``-m optim=adam,zero_adam
partitioner=sorted_greedy,flat`` the ``optim=adam`` jobs train the same thing. Each job of a
sweep names its config, without the keys its optimizer does not use, by a digest (:func:`job_key`)
with ``dp`` as resolved (``-m dp=auto,zero_lab``: a sharded optimizer's ``dp=auto`` job trains on the
engine, the same path and modes as the ``dp=zero_lab`` job), and claims it in the sweep dir with a file
created exclusively (:data:`CLAIM_NAME`: beside Hydra's
``multirun.yaml``, as the sweep dir's folders are its jobs), so parallel jobs agree on who was first.

A later job whose digest an earlier, finished job claimed is a *repeat*: it trains nothing,
writes :data:`REPEAT_FILE` into its run dir, and its objective is the earlier job's
(:mod:`zero_lab.report` lists it under that run). When the earlier job has not finished, or
failed, the job runs as usual; a requeued job finds its own claim and runs.

    original = claim(sweep_dir, job_key(config, unused, dp), run_dir, overrides)   # None: run it
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zero_lab.app.record.summary import SUMMARY_FILE
from zero_lab.files import write_json

__all__ = ["REPEAT_FILE", "Original", "claim", "job_key", "read_repeat", "why_repeat", "write_repeat"]

#: What a repeat job leaves in its run dir instead of a summary.
REPEAT_FILE = "repeat_of.json"
#: The name of a job's claim of its digest, in the sweep dir (a file: the sweep dir's folders are its jobs).
CLAIM_NAME = ".zero_lab_job_{key}.json"


@dataclass(frozen=True)
class Original:
    """The earlier job a repeat stands for: its run dir and overrides."""

    run_dir: Path
    overrides: list[str]


def job_key(config: dict[str, Any], unused: tuple[str, ...], dp: str | None = None) -> str:
    """A digest of the job's config (resolved, plain Python) without the top-level keys in
    ``unused`` (what its optimizer ignores: ``partitioner``, ``bucket_view``), its ``dp`` the path
    ``dp=auto`` resolved to where given (``ddp`` or ``zero_lab``)."""
    kept = {key: value for key, value in config.items() if key not in unused} | ({"dp": dp} if dp else {})
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:24]


def claim(sweep_dir: Path, key: str, run_dir: Path, overrides: list[str]) -> Original | None:
    """Claim ``key`` for this job; the earlier job that holds it when this one repeats it, else
    ``None`` (this job claimed it, holds it already, or the holder has not finished)."""
    path = sweep_dir / CLAIM_NAME.format(key=key)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError), open(path, "x", encoding="utf-8") as f:  # "x": created exclusively
        json.dump({"run_dir": str(run_dir), "overrides": overrides}, f)
        return None
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
        earlier = Path(held["run_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a claim being written, or damaged: run the job
    if earlier.resolve() == run_dir.resolve() or not _finished(earlier):
        return None  # a requeued job's own claim, or an earlier job still running (or failed, or stopped)
    return Original(earlier, [str(o) for o in held.get("overrides", [])])


def _finished(run_dir: Path) -> bool:
    """The run dir holds a summary of every step, not stopped by a signal."""
    try:
        done = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
        return not done.get("stopped_by") and len(done["losses"]) >= int(done["steps"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def why_repeat(overrides: list[str], earlier: list[str], unused: list[str], target: str, dp: str) -> str:
    """Why a job with ``overrides`` trains what the job with ``earlier`` did, the start of its one line:
    overrides its plain optimizer (``target``) does not use, a ``dp=`` that resolves to the path the
    other names (``dp``: the path both train on), or the same config."""
    differing = [o for o in overrides if o not in earlier]
    if unused:
        return f"{' '.join(unused)}: not used by {target}, a plain optimizer, so"
    if [o for o in overrides if o.startswith("dp=")] != [o for o in earlier if o.startswith("dp=")]:
        return f"{' '.join(differing)}: dp=auto resolves to dp={dp} here, the same path and modes, so"
    return f"{' '.join(differing) or 'its overrides'}: the same config, so"


def write_repeat(run_dir: Path, original: Original, overrides: list[str], unused: list[str]) -> None:
    """:data:`REPEAT_FILE`: which run this job repeats, and the overrides that made no difference."""
    record = {"repeat_of": str(original.run_dir), "its_overrides": original.overrides, "overrides": overrides}
    write_json(run_dir / REPEAT_FILE, {**record, "not_used": unused})


def read_repeat(run_dir: Path) -> dict[str, Any] | None:
    """A run dir's :data:`REPEAT_FILE`, ``None`` when it has none (or it cannot be read)."""
    try:
        found = json.loads((run_dir / REPEAT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "repeat_of" in found else None
