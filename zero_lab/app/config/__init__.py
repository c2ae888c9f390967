"""What a config is: its typed schema, where the YAMLs live, the ``_target_``s, Hydra's errors.

``schema`` (typed plain keys; group schemas derived from the constructors), ``paths`` (the
configs' package and the source tree), ``targets`` (every ``_target_`` checked before it is
called), ``hydra_errors`` (Hydra's composition errors as one line), ``problems`` (one
problem, one line), ``overrides`` (the command line, read by Hydra's parser), ``registered``
(``exchange=`` / ``grad_reduce=`` against the core's registries).
Imports only :mod:`zero_lab.app.workloads` of the app.
"""
