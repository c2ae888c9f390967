"""zero_lab's Slurm launcher where Hydra looks for launchers: Hydra instantiates only plugin
classes defined in the ``hydra_plugins`` package. The behaviour is all in
:class:`zero_lab.app.slurm_launcher.SlurmJobsLauncher`; ``hydra/launcher=slurm`` names this class.
"""

from zero_lab.app.slurm_launcher import SlurmJobsLauncher

__all__ = ["ZeroLabSlurmLauncher"]


class ZeroLabSlurmLauncher(SlurmJobsLauncher):
    """``hydra/launcher=slurm``: see :mod:`zero_lab.app.slurm_launcher`."""
