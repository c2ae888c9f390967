"""docs/core.md runs as written: every ``python`` block, in order, in one fresh interpreter (W=1).

The blocks share one namespace, as a reader pasting them one after another would; the
figures the page quotes beside its snippets must be what they print, those of the
"Extending zero_lab" examples (one per extension point) included. A block whose first line
names a file (``# my_sinks.py``) is written as that file next to the script instead, and the
page's ``bash`` block runs the app there (``zero-lab-train`` of this environment) with those
files; the lines the page quotes under it are what it prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.runs import REPO, child_env

DOC = REPO / "docs" / "core.md"
ENTRY = str(Path(sys.executable).with_name("zero-lab-train"))
FILE = re.compile(r"# (\w+\.py)\n")


def test_every_snippet_of_the_core_manual_runs(tmp_path):
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    files = {m.group(1): block[m.end() :] for block in blocks if (m := FILE.match(block))}
    assert sorted(files) == ["my_collectives.py", "my_sinks.py"]
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    blocks = [block for block in blocks if not FILE.match(block)]
    assert len(blocks) >= 10
    script = tmp_path / "core_doc.py"
    script.write_text("\n\n".join(blocks))
    env = child_env() | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    quoted_figures = ("SortedGreedy() 2.286", "Flat() 1.0", "Manual(order=['layer*']) 2.286", "1,750,000")
    muon = ("numel (67108864.0, 8388608.0)", "newton_schulz (37748736.0, 37748736.0)", "True False True")
    routed = ("ChainedOptimizer ['Muon', 'AdamW']", "[['1.weight', '3.weight'], ['0.weight'")
    partitioner = ("[0, 1, 2, 3, 0] 2.571", "RoundRobin() [0, 0, 0, 0]")
    collective = (
        "('broadcast', 'all_gather', 'p2p_all_gather', 'shm_all_gather', 'all_reduce')",
        "True all_reduce",
        "all_reduce all_reduce\nexchange=ring: not a registered name "
        "(auto, broadcast, all_gather, p2p_all_gather, shm_all_gather, all_reduce)\n",
    )
    family = (
        "False ['NormalizedMomentum', 'AdamW'] ChainedOptimizer",
        "Flat cuts parameter #0 (shape (64, 32), group 0)",
        "W=1: 2097152 bytes of state on the worst rank",
        "W=4: 524288 bytes of state on the worst rank",
    )
    grads = ("reduce_scatter 0", "all_reduce_keep_mine\nTrue")
    cost = ("[0, 1, 1, 0] 1.333\n[0, 1, 1, 1] 1.0\n",)
    workload = ("True True\n[] []\n",)
    launcher = ("mpirun 1 4 node1 None\n",)
    every = (*quoted_figures, *muon, *routed, *partitioner, *collective, *family, *grads, *cost, *workload, *launcher)
    for quoted in every:
        assert quoted in done.stdout, quoted
    assert "ZeRO-1 Flat() + Adam 9.5 MiB of state on the worst rank" in done.stdout
    assert (tmp_path / "outputs" / "core-doc" / "checkpoints" / "step_00000100" / "manifest.json").is_file()


def test_the_extensions_run_in_the_app_as_the_manual_says(tmp_path):
    """The page's app run: a collective chosen by its dotted path (imported and registered in
    the job and in both ranks), and a sink of one argument as the logger (no W&B keys)."""
    text = DOC.read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if match := FILE.match(block):
            (tmp_path / match.group(1)).write_text(block[match.end() :])
    (command,) = [c.strip() for c in re.findall(r"```bash\n(.*?)```", text, re.S)]
    (quoted,) = re.findall(r"```text\n(my sink:.*?)```", text, re.S)
    command = re.sub(r"(^|\s)zero-lab-train(\s)", rf"\g<1>{ENTRY}\g<2>", command)
    done = subprocess.run(
        ["bash", "-c", f"{command} hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("my sink:")]
    assert len(lines) == 4 and all(line.startswith(q) for line, q in zip(lines, quoted.strip().splitlines())), lines
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exchange"]["requested"] == "all_reduce", summary["exchange"]
