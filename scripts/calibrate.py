"""Fit this machine's Gloo (collectives, matmul, Adam) into a step-model hardware profile.

A thin command line over :mod:`zero_lab.bench.calibrate`; ``--help`` lists the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.calibrate import main

if __name__ == "__main__":
    main()
