"""zero_lab's benchmark as a library: strategies, runner, meters, targets, tables.

``scripts/bench.py`` is a thin command line over :func:`zero_lab.bench.cli.main`. The
modules, each with one job:

* :mod:`~zero_lab.bench.workloads` — the models and their synthetic data;
* :mod:`~zero_lab.bench.strategies` — ``STRATEGIES``: name -> builder (DDP, torch's
  ZeRO, FairScale OSS, zero_lab's settings, FSDP2);
* :mod:`~zero_lab.bench.stepper` — one strategy stepped and timed;
* :mod:`~zero_lab.bench.meter` — collectives counted from the profiler (for peers
  that do not meter their own; zero_lab's come from ``comm_stats``);
* :mod:`~zero_lab.bench.host` — RSS, peak RSS, free memory;
* :mod:`~zero_lab.bench.rounds` — which strategies are timed side by side;
* :mod:`~zero_lab.bench.rank` — what each rank runs; :mod:`~zero_lab.bench.run` — the worlds;
* :mod:`~zero_lab.bench.summary` — records to figures; :mod:`~zero_lab.bench.targets` —
  the targets as data and their verdicts; :mod:`~zero_lab.bench.render` — the tables;
* :mod:`~zero_lab.bench.partition_speed`, :mod:`~zero_lab.bench.plan` — the
  partitioner-speed and memory-plan commands (``scripts/bench_partition.py``, ``scripts/plan.py``);
* :mod:`~zero_lab.bench.hardware` (profiles in ``profiles/*.yaml``), :mod:`~zero_lab.bench.at_scale`
  — the step model's machines and its at-scale table (``scripts/plan.py --hardware``);
  :mod:`~zero_lab.bench.calibrate` (``scripts/calibrate.py``: this machine's Gloo fitted into a
  profile), :mod:`~zero_lab.bench.check_model` (``scripts/check_model.py``: predictions beside runs),
  :mod:`~zero_lab.bench.passes` (``scripts/time_passes.py``: the compute phase beside the passes timed).

It needs the ``[bench]`` extra (it builds the app's models); the core never imports it.
"""
