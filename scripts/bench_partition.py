"""Time to partition 10^5 parameters of realistic sizes, W = 8 … 4096 (zero_lab's heap vs an O(n·W) greedy).

A thin command line over :mod:`zero_lab.bench.partition_speed`; ``--help`` lists the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.partition_speed import main

if __name__ == "__main__":
    main()
