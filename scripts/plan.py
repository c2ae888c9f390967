"""Predict per-rank memory of ZeRO-1 at world sizes this machine cannot run.

A thin command line over :mod:`zero_lab.bench.plan`; ``--help`` lists the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.plan import main

if __name__ == "__main__":
    main()
