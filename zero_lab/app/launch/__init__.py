"""How jobs start: the console entry point, the Hydra task, the run dir, Slurm, requeues, repeats.

The top of the app: may import every folder (the README's "Developing" map names each module).
"""
