"""Muon + AdamW: DDP beside torch's and zero_lab's ZeRO-1, numel- and cost-balanced.

A thin command line over :mod:`zero_lab.bench.muon` (see ``docs/benchmarks.md``)::

    python scripts/bench_muon.py --world-sizes 2 4 --steps 12
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.muon import main

if __name__ == "__main__":
    main()
