"""The clients layer: zero_lab inside the training loops researchers use (docs/clients.md).

Each client runs under one ``torchrun --nproc_per_node 2`` (Gloo, CPU) of a script in
``tests/clients/scripts/``, which trains the same loop with AdamW and with zero_lab, saves and
resumes with the client's own calls, and writes what the test asserts to a JSON file. A client
not installed (the ``[clients]`` extra: ``pip install -e ".[clients]"``) skips with that line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.dist.worlds import run_ranks

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("scripts")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def require(*modules: str) -> None:
    """Skip the calling test, naming the extra, when one of ``modules`` is not installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[clients]' (torch==2.13.0 on the same line)")


def torchrun(script: str, out_dir: Path, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Run ``tests/clients/scripts/<script>`` on 2 Gloo ranks; returns the JSON rank 0 wrote."""
    result_file = out_dir / "result.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_DISABLED": "true", "DISABLE_MLFLOW_INTEGRATION": "TRUE"}
    command = [TORCHRUN, "--standalone", "--nproc_per_node", "2", str(SCRIPTS / script), str(out_dir), *args]
    done = subprocess.run(command, cwd=out_dir, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(result_file.read_text())


@pytest.fixture(scope="session")
def world() -> Callable[..., list[Any]]:
    return run_ranks
