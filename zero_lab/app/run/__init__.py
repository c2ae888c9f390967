"""One rank's training: build it (``build``, ``training``), run its loop (``rank_loop``, ``step``,
``rank_errors``, ``rank_log``), measure what it holds (``memory``), end it (``finish``), save and
resume it (``checkpoints``). Imports ``record``, ``plan``, ``config`` and ``workloads``.
"""
