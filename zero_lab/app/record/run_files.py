"""The names in a run dir, stated once: every module that writes or reads one imports it here.

    run_dir/
      meta.json        META_FILE: what reproduces the job (record/provenance.py), written before the ranks start
      metrics.jsonl    METRICS_FILE: one JSON object per logged step, rank 0 (record/sinks.py)
      summary.json     SUMMARY_FILE: the run's RunSummary, rank 0 at the end (record/summary.py)
      logs/            LOGS_DIR: rank<r>.log, and rank<r>.error.txt for a rank that failed

:data:`COMMAND` is how a job is started from a checkout, the head of every command the app
prints for a user to paste (``meta.json``'s ``command``, a failed run's resume hint).
"""

from __future__ import annotations

__all__ = ["COMMAND", "LOGS_DIR", "META_FILE", "METRICS_FILE", "SUMMARY_FILE"]

META_FILE = "meta.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
LOGS_DIR = "logs"
#: ``python train.py`` (then the overrides): the command a user pastes.
COMMAND = ("python", "train.py")
