"""zero_lab's Slurm launcher where Hydra looks for launchers: Hydra instantiates only plugin
classes defined in the ``hydra_plugins`` package. The behaviour is all in
:class:`zero_lab.app.launch.slurm.SlurmJobsLauncher`; ``hydra/launcher=slurm`` names this class.
"""

from zero_lab.app.launch.slurm import SlurmJobsLauncher

__all__ = ["ZeroLabSlurmLauncher"]


class ZeroLabSlurmLauncher(SlurmJobsLauncher):
    """``hydra/launcher=slurm``: see :mod:`zero_lab.app.launch.slurm`."""
