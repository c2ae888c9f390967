"""What a job prints when its ranks fail or stop: the failure in a few lines, how to continue.

describe_failure(failure, run_dir)   # "rank 1 failed: ValueError: ...\n  its log: ..."
resume_hint(run_dir, meta)           # "continue with: python train.py ... resume=<run dir>"
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from zero_lab.app.record.run_files import COMMAND, LOGS_DIR
from zero_lab.checkpoint import find_checkpoint
from zero_lab.files import write_atomic
from zero_lab.runtime.spawn import RankFailure, RankStalled, describe_exit, last_line

__all__ = ["describe_failure", "hydra_quoted", "resume_hint"]


def resume_hint(run_dir: Path, meta: dict[str, Any]) -> str:
    """``continue with: python train.py <the same overrides> resume=<run dir>``, shell-quoted
    so it can be pasted as is (paths with spaces, overrides with brackets), the path also
    quoted for Hydra's override parser where it would read it otherwise (a comma: a sweep)."""
    found = find_checkpoint(run_dir)
    if found is None:
        return "no complete checkpoint to resume from"
    kept = [o for o in meta.get("overrides", []) if not o.startswith(("resume=", "hydra."))]
    return "continue with: " + shlex.join([*COMMAND, *kept, f"resume={hydra_quoted(str(run_dir))}"])


_HYDRA_PLAIN = re.compile(r"[\w./:@%+~-]+")


def hydra_quoted(value: str) -> str:
    """``value`` as a Hydra override value that parses back to itself: as is when plain,
    else single-quoted (``'/runs/a,b'``; a quote inside escaped as ``\\'``)."""
    return value if _HYDRA_PLAIN.fullmatch(value) else "'" + value.replace("'", "\\'") + "'"


def describe_failure(failure: RankFailure, run_dir: Path) -> str:
    """Which rank failed and how (its error's own message, first line — or the signal / exit
    code it died of, or how it stalled), where its log is, and its full traceback saved in
    the run dir."""
    path = run_dir / LOGS_DIR / f"rank{failure.rank}.error.txt"
    write_atomic(path, lambda f: f.write(failure.details.encode("utf-8")))
    if failure.exitcode is not None:
        what = (
            f"its process was {describe_exit(failure.exitcode)}"
            if failure.exitcode < 0
            else (f"its process ended with {describe_exit(failure.exitcode)} before reporting")
        )
    else:
        what = failure.summary
    if isinstance(failure, RankStalled):  # the others' /proc states, or the peer that waited
        echoes = "".join(f"\n  (rank {r}: {last_line(d)[:200]})" for r, d in sorted(failure.others.items()))
    else:
        echoes = "".join(f"\n  (rank {r} {_echo(d, failure.details)})" for r, d in sorted(failure.others.items()))
    log_path = run_dir / LOGS_DIR / f"rank{failure.rank}.log"
    verb = "stalled" if isinstance(failure, RankStalled) else "failed"
    what = what.removeprefix("stalled: ")
    return f"rank {failure.rank} {verb}: {what}\n  its log: {log_path}\n  full traceback: {path}{echoes}"


def _echo(details: str, first: str) -> str:
    """Another rank's failure beside the first: the same error (a checkpoint every rank
    refused), or what it failed of after it (often only the first one's echo)."""
    line = last_line(details)
    return "failed too, with the same error" if line == last_line(first) else f"failed after it: {line[:200]}"
