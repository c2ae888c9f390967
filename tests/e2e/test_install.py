"""The configs live in the top-level ``conf/`` and an installed wheel still carries and runs them.

The wheel is built from the checkout (``pip wheel --no-deps``), unpacked (a pure-Python wheel
installs by unpacking) into a temporary site dir that comes first on ``sys.path``, and
``zero-lab-train``'s entry point trains from a directory outside the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from tests.e2e.runs import REPO, child_env

LOCAL_ONLY = (".venv", ".git", "outputs", "build", "*.egg-info", "__pycache__", ".*_cache", "multirun", "wandb")
ENTRY = (  # what the zero-lab-train console script runs (pyproject's [project.scripts])
    "import zero_lab; print('package:', zero_lab.__file__, flush=True); from zero_lab_train import main; main()"
)


def test_conf_is_top_level_and_the_wheel_carries_it_and_trains(tmp_path):
    assert (REPO / "conf" / "config.yaml").is_file() and not (REPO / "zero_lab" / "conf").exists()
    source = tmp_path / "src"  # a clean copy: pip builds in-tree, and a stale build/ would leak old files
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*LOCAL_ONLY))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), source],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("zero_lab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("zero_lab/conf/")}
        archive.extractall(tmp_path / "site")
    in_checkout = {f"zero_lab/conf/{p.relative_to(REPO / 'conf')}" for p in (REPO / "conf").rglob("*.yaml")}
    assert in_checkout and {n for n in shipped if n.endswith(".yaml")} == in_checkout  # every YAML, nothing else
    assert "hydra_plugins/zero_lab_slurm/__init__.py" in archive.namelist()  # hydra/launcher=slurm's plugin
    assert "zero_lab_train.py" in archive.namelist()  # zero-lab-train's entry point, beside the package

    env = child_env() | {"PYTHONPATH": str(tmp_path / "site")}
    job = subprocess.run(
        [sys.executable, "-c", ENTRY, "logger=none", "steps=2", "dist.world_size=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert job.returncode == 0, job.stderr[-2000:]
    assert f"package: {tmp_path / 'site'}" in job.stdout  # the wheel's package, not the checkout's
    assert "zero_lab: final loss" in job.stdout + job.stderr
    assert list((tmp_path / "outputs").glob("*/*/summary.json"))
