"""Hierarchical sharding across a slowed inter-node link (two network namespaces, a tbf-limited veth):
step time and bytes across, measured and predicted. Needs root.

A thin command line over :mod:`zero_lab.bench.link_bench`; ``--help`` lists the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.bench.link_bench import main

if __name__ == "__main__":
    main()
