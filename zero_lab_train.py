"""``zero-lab-train`` and ``python train.py``: the app's entry point behind a guard for stop signals.

    zero-lab-train optim=zero_adam dist.world_size=2

Loading torch and Hydra takes a second or more, and a SIGTERM or SIGINT then would kill the
process silently (exit -15) or print a ``KeyboardInterrupt`` traceback from inside an import.
:func:`main` handles both signals before anything heavy is imported (one line, exit code
128 + the signal, nothing written), hands over to the entry point's own handling once it is
loaded (:mod:`zero_lab.app.launch.entry`, :mod:`zero_lab.runtime.signals`), and after the job
has returned (the interpreter ending W&B's and zero_lab's threads) handles them again: one
line, exit at once.

A module of its own beside the package, importing the standard library only: any module inside
``zero_lab`` imports the package first, and the package imports torch.
"""

import os
import signal
import sys

__all__ = ["main"]

_STOP = (signal.SIGTERM, signal.SIGINT)


def _stopped_while_importing(signum: int, _frame: object) -> None:
    """SIGTERM / SIGINT while torch and Hydra load: one line, exit 128 + signal."""
    print(f"zero_lab: stopped by {signal.Signals(signum).name} while starting; nothing was written", file=sys.stderr)
    raise SystemExit(128 + signum)


def _stopped_while_exiting(signum: int, _frame: object) -> None:
    """SIGTERM / SIGINT after the job has returned (its files written; the interpreter is ending
    W&B's and zero_lab's threads): one line, exit 128 + signal at once, nothing left to unwind."""
    print(
        f"zero_lab: stopped by {signal.Signals(signum).name} while exiting; the job had ended, its files are kept",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + signum)


def main() -> None:
    """Run the app's entry point (:func:`zero_lab.app.launch.entry.main`) with the signals guarded
    while it loads and after it returns (module docstring)."""
    for sig in _STOP:
        signal.signal(sig, _stopped_while_importing)
    from zero_lab.app.launch.entry import main as entry_main

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        entry_main()
    finally:
        for sig in _STOP:
            signal.signal(sig, _stopped_while_exiting)
