"""What a config is: its typed schema, where the YAMLs live, every ``_target_`` checked before it is
called, its problems (one line each), the command line as Hydra reads it, the registered
``exchange=`` / ``grad_reduce=`` choices. Imports only :mod:`zero_lab.app.workloads` of the app.
"""
