"""Start-up cost of the app: the default job's wall time against a bare DDP + Adam script.

The bare script is what a researcher would write by hand for the same work: 2 Gloo ranks
(``torch.multiprocessing.spawn``), the default job's MLP (256 -> 512 -> 512 -> 512 -> 256,
tanh), its batch of 32 split over the ranks, ``torch.optim.Adam(lr=1e-3)``, 20 steps, no
logging. The app's run adds Hydra's composition, the pre-start checks, the run dir, W&B
offline, the metrics files and the closing lines. Both are timed as whole processes,
interleaved (app, bare, app, bare, ...), so a load that comes and goes hits both alike.

    python scripts/startup.py --repeats 5       # prints each run's wall time, the medians and their ratio
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20

BARE_SCRIPT = f"""
import os, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def run(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dims = [256, 512, 512, 512, 256]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = DDP(nn.Sequential(*layers[:-1]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range({STEPS}):
        x, y = torch.randn(32, 256, generator=gen), torch.randn(32, 256, generator=gen)
        half = slice(rank * 16, rank * 16 + 16)
        loss = nn.functional.mse_loss(model(x[half]), y[half])
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    mp.spawn(run, args=(2,), nprocs=2)
"""


def _timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"startup.py: {' '.join(command)} failed (rc {done.returncode}):\n{done.stderr[-2000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="paired runs of each (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zero_lab_startup_") as tmp:
        bare = Path(tmp) / "bare_ddp.py"
        bare.write_text(BARE_SCRIPT)
        app = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp}/run${{now:%H%M%S%f}}"]
        env_note = os.environ.get("WANDB_MODE", "offline")
        app_s, bare_s = [], []
        for repeat in range(args.repeats):
            app_s.append(_timed(app, ROOT))
            bare_s.append(_timed([sys.executable, str(bare)], Path(tmp)))
            print(f"run {repeat + 1}: app {app_s[-1]:.2f} s, bare DDP + Adam {bare_s[-1]:.2f} s", flush=True)
    app_median, bare_median = statistics.median(app_s), statistics.median(bare_s)
    print(
        f"default job (W&B {env_note}): median {app_median:.2f} s (min {min(app_s):.2f}); "
        f"bare 2-rank Gloo DDP + Adam, {STEPS} steps: median {bare_median:.2f} s (min {min(bare_s):.2f}); "
        f"ratio of medians {app_median / bare_median:.2f}"
    )


if __name__ == "__main__":
    main()
