"""Benchmark zero_lab beside torch's ZeroRedundancyOptimizer, FairScale OSS, FSDP2 and DDP + Adam.

A thin command line over :mod:`zero_lab.bench` (see ``docs/benchmarks.md``)::

    python scripts/bench.py --quick      # a few minutes on 2 CPU cores
    python scripts/bench.py              # full: 20×Linear(2000,2000) and the LM, W = 1, 2, 4
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.cli import main

if __name__ == "__main__":
    main()
