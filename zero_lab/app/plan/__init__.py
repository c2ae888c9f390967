"""What a config implies, answered once before anything is built: the run's plan.

``optim_plan`` (is it ZeRO, which ``torch.optim`` class steps). Imports ``config`` and
``workloads`` of the app.
"""
