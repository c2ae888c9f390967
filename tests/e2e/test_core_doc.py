"""docs/core.md runs as written: every ``python`` block, in order, in one fresh interpreter (W=1).

The blocks share one namespace, as a reader pasting them one after another would; the
figures the page quotes beside its snippets must be what they print, those of the
"Extending zero_lab" examples (a partitioner, a collective, an optimizer family) included.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.e2e.runs import REPO, child_env

DOC = REPO / "docs" / "core.md"


def test_every_snippet_of_the_core_manual_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
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
    collective = ("('broadcast', 'all_gather', 'all_reduce')", "True all_reduce")
    family = (
        "False ['NormalizedMomentum', 'AdamW'] ChainedOptimizer",
        "Flat cuts parameter #0 (shape (64, 32), group 0)",
        "W=1: 2097152 bytes of state on the worst rank",
        "W=4: 524288 bytes of state on the worst rank",
    )
    grads = ("reduce_scatter 0", "all_reduce_keep_mine\nTrue")
    for quoted in (*quoted_figures, *muon, *routed, *partitioner, *collective, *family, *grads):
        assert quoted in done.stdout, quoted
    assert "ZeRO-1 Flat() + Adam 9.5 MiB of state on the worst rank" in done.stdout
    assert (tmp_path / "outputs" / "core-doc" / "checkpoints" / "step_00000100" / "manifest.json").is_file()
