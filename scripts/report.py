"""Turn a run dir or a sweep dir into a table, PNG plots and one offline HTML page.

    python scripts/report.py outputs/multirun/2026-11-23/10-00-00          # -> <dir>/report/
    python scripts/report.py outputs/2026-11-23/10-00-00 --out /tmp/report

A thin command line over :mod:`zero_lab.report` (same as ``python -m zero_lab.report``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # zero_lab from this checkout, installed or not

from zero_lab.report import main

if __name__ == "__main__":
    sys.exit(main())
