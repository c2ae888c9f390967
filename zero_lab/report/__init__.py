"""Turn a run dir or a whole sweep dir into a table, three PNG plots and one offline HTML page.

    python -m zero_lab.report outputs/multirun/2026-11-23/10-00-00        # -> <dir>/report/
    python scripts/report.py outputs/2026-11-23/10-00-00 --out /tmp/report

Needs only the ``[report]`` extra (matplotlib, PyYAML); reads the run dirs' files
(``summary.json``, ``metrics.jsonl``, ``meta.json``, ``.hydra/``), never the network or
W&B, and is imported by neither the core nor the training app. Modules, one job each:

* :mod:`~zero_lab.report.runs`  — find run dirs, load them, say why a run is incomplete,
  label each run by the overrides that differ across the runs;
* :mod:`~zero_lab.report.table` — the columns and their units;
* :mod:`~zero_lab.report.plots` — memory vs W, step time split, loss curves;
* :mod:`~zero_lab.report.page`  — the self-contained HTML page;
* :mod:`~zero_lab.report.cli`   — :func:`write_report` and the command line.
"""

from zero_lab.report.cli import main, write_report

__all__ = ["main", "write_report"]
