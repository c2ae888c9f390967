"""What a config implies, answered once before anything is built: the run's plan (one meta model
per job), which ``torch.optim`` class steps, and the strategy (plain DDP, ZeRO or the engine) as
one typed object. Imports ``config`` and ``workloads`` of the app.
"""
