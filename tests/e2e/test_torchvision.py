"""A broken torchvision beside CPU torch, as PyPI's ``torchvision==0.28.0`` leaves it, refused
before start in one line with the fix, and the install check saying the same.

The torchvision here is a fake: a package on ``PYTHONPATH`` whose import raises what the real
CUDA build raises on CPU torch (``operator torchvision::nms does not exist``), with the
``dist-info`` metadata pip would write. A fake is used only because the real broken install
would destroy the environment: ``pip install torchvision==0.28.0`` into this venv breaks every
``transformers`` import for every other test (and an unpinned one replaces torch with a 6 GB
CUDA build). Everything else is real: ``transformers`` imports the fake and fails as it does
with the real one, and ``train.py`` runs as a user runs it.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from tests.e2e.runs import REPO, child_env, together, train

FIX = "pip install torch==2.13.0 torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu"
HF_MODEL = """_target_: transformers.GPT2LMHeadModel
config:
  _target_: transformers.GPT2Config
  vocab_size: 256
  n_positions: 64
  n_embd: 32
  n_layer: 1
  n_head: 2
"""


def fake_torchvision(root: Path, version: str) -> Path:
    """A ``torchvision`` whose import fails as the CUDA build's does on CPU torch; pip's metadata says ``version``."""
    (root / "torchvision").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    info = root / f"torchvision-{version.split('+')[0]}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {version}\n")
    return root


def test_a_cuda_torchvision_beside_cpu_torch_is_refused_in_one_line_before_start(tmp_path):
    """PyPI's 0.28.0 (no +cpu): refused from its metadata, for the shipped model=gpt2 and by the install check."""
    env = child_env() | {"PYTHONPATH": str(fake_torchvision(tmp_path / "site", "0.28.0"))}
    run_dir = tmp_path / "run"
    refused, check = together(
        functools.partial(train, "model=gpt2", "data=text", "logger=none", f"hydra.run.dir={run_dir}", env=env),
        functools.partial(
            subprocess.run,
            [sys.executable, "-m", "zero_lab.app.workloads.torch_extras"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        ),
    )
    problem = (
        "model._target_=zero_lab.app.workloads.hf_models.GPT2: "
        "torchvision 0.28.0 is installed beside torch 2.13.0+cpu: only "
        "torch is a CPU build (+cpu), so torchvision's ops fail (operator torchvision::nms does not exist), and "
        f"transformers imports it; fix: {FIX} (or pip uninstall torchvision: zero_lab does not need it)"
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == ["zero_lab: invalid config (1 problem):", f"  - {problem}"]
    assert not run_dir.exists()  # refused before Hydra made a run dir
    assert check.returncode == 1 and check.stderr.strip() == f"zero_lab: {problem.split(': ', 1)[1]}"


def test_a_transformers_class_that_fails_to_import_because_of_torchvision_says_so(tmp_path):
    """Metadata that pairs (0.28.0+cpu) but an import that still fails: the root cause, named."""
    env = child_env() | {"PYTHONPATH": str(fake_torchvision(tmp_path / "site", "0.28.0+cpu"))}
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "gpt2_hf.yaml").write_text(HF_MODEL)
    run_dir = tmp_path / "run"
    refused = train(
        "--config-dir", str(tmp_path / "conf"), "model=gpt2_hf", "data=text", "logger=none", f"hydra.run.dir={run_dir}",
        env=env,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = (
        "  - model._target_=transformers.GPT2LMHeadModel cannot be imported because torchvision is broken "
        f"(RuntimeError: operator torchvision::nms does not exist); fix: {FIX} (or pip uninstall torchvision: "
        "zero_lab does not need it)"
    )
    assert refused.stderr.strip().splitlines() == ["zero_lab: invalid config (1 problem):", line]  # nothing else
    assert not run_dir.exists()
