"""One rank's training: build it, run its loop, step it, save and resume it.

``build`` (model -> DDP -> optimizer, in the order they must be made), ``training`` (what a
rank trains with), ``rank_loop`` (the loop of one rank), ``step`` (one measured optimizer step
and the validation loss), ``finish`` (replicas agreed, summary.json), ``rank_log`` (the rank's
log file), ``memory`` (what a rank holds, measured), ``rank_errors`` (failures in the loop,
worded), ``checkpoints`` /
``dcp_checkpoints`` (the run's checkpoints and resume). Imports ``record``, ``plan``,
``config`` and ``workloads`` of the app.
"""
