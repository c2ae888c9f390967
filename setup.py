"""Build glue that pyproject.toml cannot state: the top-level ``conf/`` ships as ``zero_lab.conf``.

The configs live in ``conf/`` next to ``zero_lab/`` (one folder per config group), and are
read only through the import system (``pkg://zero_lab.conf``), so a checkout installed with
``pip install -e .`` and a wheel serve the same files: the editable install maps the package
``zero_lab.conf`` onto ``conf/``; a wheel carries ``conf/`` as ``zero_lab/conf/``, and the Slurm launcher plugin as
``hydra_plugins/zero_lab_slurm/``.
"""

from setuptools import find_namespace_packages, find_packages, setup

setup(
    packages=[
        *find_packages(include=["zero_lab", "zero_lab.*"]),
        # hydra_plugins is a namespace package shared with Hydra's own plugins (no __init__.py):
        # the Slurm launcher ships as hydra_plugins.zero_lab_slurm, where Hydra looks for it.
        *find_namespace_packages(include=["hydra_plugins.*"]),
        "zero_lab.conf",
    ],
    package_dir={"zero_lab.conf": "conf"},
    # zero-lab-train's entry point: beside the package, so starting it imports no torch (its docstring)
    py_modules=["zero_lab_train"],
)
