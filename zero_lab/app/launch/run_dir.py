"""One run dir, one job: claim it atomically before Hydra writes anything into it.

Hydra's default run dir is ``outputs/<date>/<H-M-S>``: two jobs started in the same second
would share it. :class:`ClaimRunDir`, a Hydra callback (``hydra.callbacks`` in
``conf/config.yaml``), runs before Hydra creates the dir and writes ``.hydra/``:

* the default dir is claimed with an exclusive ``mkdir``; a job that finds it taken moves
  to the first free ``<dir>-1``, ``<dir>-2``, ... (the job's config records where it went);
* a dir given explicitly (``hydra.run.dir=...``) may be reused by later runs, but not by two
  at once: the job holds an exclusive ``flock`` on ``<dir>/.zero_lab.lock`` while it runs
  (the kernel drops it when the process ends, even on ``kill -9``). A later run first moves
  the earlier run's ``metrics.jsonl``, ``summary.json`` and rank logs to ``<dir>/earlier/<k>/``
  (:func:`set_aside_earlier_run`), so a stale summary or error is never read as its own;
  ``checkpoints/`` stay, for ``resume=<dir>``;
* a dir that cannot be claimed stops the job with one line naming it (exit 2);
* ``/`` and the system's own dirs (:func:`system_dir`) are refused before anything is created
  in them, whatever the permissions (root may write there), as run and as sweep dirs;
* each job of a ``-m`` sweep locks its own job dir the same way.

Under torchrun or srun every rank runs the Hydra job in the one shared dir on purpose: no claim;
under the Slurm launcher's multi-node mode rank 0 claims the job dir and the others join it.

    claim("outputs/2026-11-23/10-00-00", explicit=False)  # -> Path(".../10-00-00-1") if taken
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.check.before_start import fail
from zero_lab.app.config.overrides import given
from zero_lab.app.record.run_files import LOGS_DIR, METRICS_FILE, SUMMARY_FILE
from zero_lab.runtime import external

__all__ = ["ClaimRunDir", "claim", "set_aside_earlier_run", "system_dir"]

LOCK_NAME = ".zero_lab.lock"
#: What a run writes that a later run in the same dir would append to or be mistaken for.
EARLIER_RUN_FILES = (METRICS_FILE, SUMMARY_FILE, LOGS_DIR)
#: Dirs no run may use as its own: the root and the top-level dirs that many users and the system share.
SYSTEM_DIRS = ("/", "/home", "/mnt", "/media", "/opt", "/run", "/srv", "/tmp", "/var")
#: Trees the system owns: neither they nor anything under them is a run dir.
SYSTEM_TREES = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr",
    "/var/cache", "/var/lib", "/var/log", "/var/spool",
)  # fmt: skip
T = TypeVar("T")
_HELD: dict[str, int] = {}  # run dir -> the open lock file's fd, held until this process exits


class RunDirBusy(RuntimeError):
    """Another live job holds the run dir."""


_RANK_FILE = re.compile(r"rank\d+\.(log|error\.txt)")


def system_dir(path: str | Path) -> str | None:
    """The system dir ``path`` is or lies in (:data:`SYSTEM_DIRS`, :data:`SYSTEM_TREES`), as
    given and with its links followed (``/lib`` is ``/usr/lib`` on most systems); ``None`` if none."""
    given = Path(os.path.abspath(Path(path).expanduser()))
    for candidate in (given, given.resolve()):
        if str(candidate) in SYSTEM_DIRS:
            return str(candidate)
        for tree in SYSTEM_TREES:
            if candidate == Path(tree) or Path(tree) in candidate.parents:
                return tree
    return None


def _refuse_system_dir(path: str | Path, key: str) -> None:
    """Refuse a run or sweep dir that is a system dir, in one line (nothing is created there)."""
    found = system_dir(path)
    if found is not None:
        where = "is" if str(found) == os.path.abspath(Path(path).expanduser()) else f"lies in {found},"
        raise RunDirBusy(
            f"run dir {path} {where} a system directory; a run writes .hydra/, train.log, logs/ and its metrics "
            f"there: give {key}=<a dir of yours> (e.g. outputs/<name>)"
        )


def _lock(directory: Path) -> None:
    """Hold an exclusive lock on ``directory``'s lock file for the life of this process."""
    key = str(directory.resolve())
    if key in _HELD:
        return
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirBusy(
            f"run dir {directory} is in use by another running job (pid {holder}); give this job its own "
            f"hydra.run.dir=... (or leave it out: the default dir is unique per job)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd


def set_aside_earlier_run(directory: Path) -> Path | None:
    """Move an earlier run's :data:`EARLIER_RUN_FILES` into ``<directory>/earlier/<k>/`` (the
    first free ``k``); returns that folder, or ``None`` when the dir held none of them."""
    present = [directory / name for name in EARLIER_RUN_FILES if name != LOGS_DIR and (directory / name).exists()]
    logs = directory / LOGS_DIR
    rank_logs = sorted(p for p in logs.iterdir() if _RANK_FILE.fullmatch(p.name)) if logs.is_dir() else []
    if not present and not rank_logs:
        return None
    for k in itertools.count(1):  # the first free k, taken by an exclusive mkdir
        target = directory / "earlier" / str(k)
        with contextlib.suppress(FileExistsError):
            target.mkdir(parents=True)
            break
    for path in present:
        os.replace(path, target / path.name)
    if rank_logs:  # only zero_lab's own files: a user's logs/ in a reused dir (hydra.run.dir=.) stays
        (target / LOGS_DIR).mkdir()
        for path in rank_logs:
            os.replace(path, target / LOGS_DIR / path.name)
        with contextlib.suppress(OSError):
            logs.rmdir()  # only if nothing of the user's is left in it
        present.append(logs)
    names = ", ".join(path.name for path in present)
    print(f"zero_lab: note: {directory} held an earlier run's {names}; moved to {target}", file=sys.stderr, flush=True)
    return target


def _claim_or_fail(path: Path, take: Callable[[], T]) -> T:
    """``take()``, the claim of ``path``; a claim that fails stops the job with one line naming
    the dir (exit 2): Hydra would only warn about a callback's error and run on, unclaimed."""
    try:
        return take()
    except RunDirBusy as error:
        fail(error)
    except OSError as error:
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(path) else ""
        fail(
            f"run dir {path} cannot be used: {error.strerror or error}{where}; give a writable hydra.run.dir=... "
            "(or hydra.sweep.dir=... with -m)"
        )
    except ValueError as error:  # a path the OS cannot take (an embedded NUL, a root with no name)
        fail(
            f"run dir {path} cannot be claimed ({type(error).__name__}: {error}); the job does not run without its "
            "claim: give a writable hydra.run.dir=<a dir of yours> (or hydra.sweep.dir=... with -m)"
        )


def _take(directory: Path) -> None:
    """Lock ``directory`` for this job, then set an earlier run's files aside."""
    _lock(directory)
    set_aside_earlier_run(directory)


def claim(path: str | Path, explicit: bool) -> Path:
    """Claim ``path`` for this process (see the module docstring); returns the dir claimed."""
    _refuse_system_dir(path, "hydra.run.dir")
    path = Path(path)
    if explicit:
        path.mkdir(parents=True, exist_ok=True)
        _take(path)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in range(1000):
        candidate = path if suffix == 0 else path.with_name(f"{path.name}-{suffix}")
        with contextlib.suppress(FileExistsError):
            candidate.mkdir()
            _lock(candidate)
            return candidate
    raise RunDirBusy(f"no free run dir next to {path} (tried {path.name}-1 ... -999)")


class ClaimRunDir(Callback):
    """Hydra callback: claim the run dir before the job writes into it (module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if external.active():
            return
        wanted = str(config.hydra.run.dir)
        explicit = given(config.hydra.overrides.hydra, "hydra.run.dir")  # else Hydra's default dir
        claimed = _claim_or_fail(Path(wanted), lambda: claim(wanted, explicit))
        if str(claimed) != wanted:
            with read_write(config.hydra), open_dict(config.hydra):
                OmegaConf.update(config, "hydra.run.dir", str(claimed), merge=False)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if external.rank() > 0 or config.hydra.mode != RunMode.MULTIRUN:
            return
        output = Path(str(config.hydra.runtime.output_dir))

        def take() -> None:
            _refuse_system_dir(output, "hydra.sweep.dir")
            _take(output)

        _claim_or_fail(output, take)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep dir that is a system dir is refused before Hydra's launcher creates anything in it."""
        if external.rank() > 0:
            return
        try:
            _refuse_system_dir(str(config.hydra.sweep.dir), "hydra.sweep.dir")
        except RunDirBusy as error:
            fail(error)
        except (OmegaConfBaseException, OSError, ValueError) as error:
            fail(f"hydra.sweep.dir: cannot be read ({type(error).__name__}: {error})")
