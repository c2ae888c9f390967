"""Where the app's files live: the Hydra configs (the package ``zero_lab.conf``) and the source tree.

The configs are the top-level ``conf/`` of the repository, served as the package
``zero_lab.conf`` and read only through the import system: an editable install maps that
package onto ``conf/`` (setup.py's ``package_dir``), a wheel carries it as
``zero_lab/conf/``. So ``train.py`` in a checkout and ``zero-lab-train`` from an installed
wheel compose the same tree. Runs land under ``outputs/`` of the working directory (Hydra's
convention); override ``hydra.run.dir=...`` / ``hydra.sweep.dir=...`` to move them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["CONF_DIR", "CONF_MODULE", "CONF_PACKAGE", "SOURCE_DIR", "group_options"]

SOURCE_DIR = Path(__file__).resolve().parents[2]  # the zero_lab package (inside a checkout: its git tree)
CONF_MODULE = "zero_lab.conf"
CONF_PACKAGE = f"pkg://{CONF_MODULE}"


def _conf_dir() -> Path:
    """The folder the import system serves ``zero_lab.conf`` from (``conf/`` in a checkout)."""
    spec = importlib.util.find_spec(CONF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"{CONF_MODULE}: the configs are not installed; in a checkout run `make setup` "
            "(pip install -e .), which maps the package onto conf/"
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve()


CONF_DIR = _conf_dir()


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The options of config group ``group``: the names of ``<conf_dir>/<group>/*.yaml``, sorted.
    The one list of them; a message that names options reads it, so a new YAML shows up there."""
    return sorted(path.stem for path in Path(conf_dir, group).glob("*.yaml"))
