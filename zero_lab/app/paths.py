"""Where the app's files live: the packaged Hydra configs and the source tree (for the git revision).

The configs ship inside the package (``zero_lab/conf``), so ``train.py`` in a checkout and
``zero-lab-train`` from an installed wheel compose the same tree. Runs land under
``outputs/`` of the working directory (Hydra's convention); override
``hydra.run.dir=...`` / ``hydra.sweep.dir=...`` to move them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CONF_DIR", "CONF_PACKAGE", "SOURCE_DIR"]

SOURCE_DIR = Path(__file__).resolve().parents[1]  # the zero_lab package (inside a checkout: its git tree)
CONF_DIR = SOURCE_DIR / "conf"
CONF_PACKAGE = "pkg://zero_lab.conf"
