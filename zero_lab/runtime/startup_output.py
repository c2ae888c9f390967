"""What a rank's native code prints while the process group connects, held back until it is known.

Gloo connects a rank to every peer inside ``init_process_group`` and logs each refused connection
from C++ straight to file descriptor 2 (``ERROR failed to connect, willRetry=1 …``, then
``Gloo connectFullMesh failed``). When a peer ends while the world starts — a Ctrl-C or
``scancel`` reaches the ranks one ``kill`` apart, or a peer ran out of memory — those lines are
only the echo of its end, and they would land on the job's terminal around the one line that
names the cause.

:func:`held_stderr` points descriptor 2 at an unnamed temporary file for the block. If the block
succeeds, what was held is written to the real stderr (a warning printed while connecting is
delayed, not lost); if it raises, the held text is attached to the exception as a note, so it
reaches the rank's failure report (the job's log) instead of the terminal; if the process is
killed inside the block, it goes with it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import IO

__all__ = ["held_stderr"]

_STDERR_FD = 2


@contextlib.contextmanager
def held_stderr() -> Iterator[None]:
    """Hold what is written to descriptor 2 inside the block (native code and Python alike)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        real = os.dup(_STDERR_FD)
        os.dup2(held.fileno(), _STDERR_FD)
        try:
            yield
        except BaseException as error:
            _restore(real)
            text = _read(held)
            if text:
                error.add_note(f"printed while connecting:\n{text}")
            raise
        _restore(real)
        text = _read(held)
        if text:
            sys.stderr.write(text)
            sys.stderr.flush()


def _restore(real: int) -> None:
    sys.stderr.flush()
    os.dup2(real, _STDERR_FD)
    os.close(real)


def _read(held: IO[bytes]) -> str:
    held.seek(0)
    return held.read().decode(errors="replace").rstrip()
