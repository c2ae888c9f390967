"""Time the forward and backward here beside the step model's compute phase.

A thin command line over :mod:`zero_lab.bench.passes`; ``--help`` lists the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.passes import main

if __name__ == "__main__":
    main()
