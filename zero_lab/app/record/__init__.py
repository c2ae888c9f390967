"""What a run records and says: metrics, sinks, W&B, summary.json, meta.json, closing lines.

Imports ``config``, ``plan`` and ``workloads`` of the app (the README's "Developing" map names each module).
"""
