"""zero_lab's entry point: ZeRO-1 data-parallel training, every part chosen with Hydra.

    python train.py                                   # embedded default: ZeRO-Adam, 2 CPU ranks
    python train.py optim=adam dist.world_size=4      # plain DDP + Adam baseline on 4 ranks
    python train.py -m optim=adam,zero_adam dist.world_size=1,2
    torchrun --nproc_per_node 2 train.py optim=zero_adam

The same job is ``zero-lab-train`` once the package is installed. The loop lives in
``zero_lab.app`` (importable, testable); this file only calls its entry point. Ranks start
inside the Hydra job (one run dir per job); under torchrun each process is one rank.
"""

import os
import signal
import sys


def _stopped_while_importing(signum: int, _frame: object) -> None:
    """SIGTERM / SIGINT while torch and Hydra load (a second or more): one line, exit 128 + signal.
    Once loaded, the entry point's own handling takes over (zero_lab.runtime.signals)."""
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


if __name__ == "__main__":
    for _sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_sig, _stopped_while_importing)
    from zero_lab.app.launch.entry import main

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main()
    finally:
        for _sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(_sig, _stopped_while_exiting)
