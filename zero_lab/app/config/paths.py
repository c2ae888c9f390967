"""Where the app's files live: the Hydra configs (the package ``zero_lab.conf``) and the source tree.

The configs are the repository's ``conf/``, read only through the import system: an editable
install maps the package ``zero_lab.conf`` onto ``conf/`` (setup.py's ``package_dir``), a wheel
carries it, so ``train.py`` in a checkout and an installed ``zero-lab-train`` compose one tree.
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
    """The options of ``group`` (``<conf_dir>/<group>/*.yaml``, sorted): every message naming options reads it."""
    return sorted(path.stem for path in Path(conf_dir, group).glob("*.yaml"))
