"""The step model's predictions beside measured runs here: step time and bytes, W = 1-4.

A thin command line over :mod:`zero_lab.bench.check_model`; ``--help`` lists the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.check_model import main

if __name__ == "__main__":
    main()
