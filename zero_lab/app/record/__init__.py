"""What a run records and says: metrics, sinks, W&B, summary.json, meta.json, closing lines.

``catalogue`` (every metric's name, key, unit and meaning, once), ``summary`` (:class:`RunSummary`),
``metrics`` (one gather per step), ``sinks`` (metrics.jsonl and the logger) / ``wandb_run`` (what the W&B run shows),
``provenance`` (meta.json), ``closing`` (the lines a job ends with), ``failure_text`` (what a
failed job says), ``progress`` (rank 0's bar), ``objective`` (what a job returns to its
sweeper). Imports ``config``, ``plan`` and ``workloads`` of the app.
"""
