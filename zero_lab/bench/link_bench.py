"""``python scripts/bench_link.py``: hierarchical sharding across a slowed inter-node link, measured and predicted.

Makes two "nodes" (:class:`~zero_lab.bench.netns.TwoNodes`: network namespaces joined by a veth
limited to ``--rate-mbit`` each way), then for every configuration of
:data:`~zero_lab.bench.link.CONFIGS` (ZeRO-Adam on DDP, zero_lab's engine) and both shard sizes
(``dist.shard_size=node``: S=2, a node; ``dist.shard_size=4``: S=W) trains the W=4 job
(2 nodes × 2 ranks, torchrun per node) for ``--short`` and ``--long`` steps
(:func:`~zero_lab.bench.link.measure_link`). Prints (and writes, ``--out``) a Markdown table per
configuration: the median step time against the step model's (on ``gloo_local`` inside a node and
the link's rate between nodes, :func:`~zero_lab.bench.link.link_hardware`), the bytes per step that
crossed the link (the kernel's count, both directions) against the model's and the app's
inter-node meter, and S=W over S=node for each. The namespaces and every process in them are
removed at the end, after an error, on Ctrl-C and on SIGTERM::

    python scripts/bench_link.py                        # 100 Mbit/s, 3 and 10 steps
    python scripts/bench_link.py --rate-mbit 400 --configs ddp_path --short 2 --long 5

Needs root (namespaces, tc). Times depend on the load: the header carries the load average.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from zero_lab.bench.link import (
    CONFIGS,
    SAMPLES_PER_RANK,
    LinkMeasurement,
    app_metered_phases,
    link_hardware,
    measure_link,
    mlp_specs,
    predict_link,
)
from zero_lab.bench.netns import TwoNodes, unavailable
from zero_lab.bench.render import error_percent, markdown_table
from zero_lab.bench.script_args import command_line, script_parser
from zero_lab.files import write_atomic

__all__ = ["LinkRow", "format_rows", "main"]

WORLD = 4
SHARDS = {"node": 2, "4": 4}  # dist.shard_size as given -> S


@dataclass(frozen=True)
class LinkRow:
    """One configuration at one S: predicted and measured step time and bytes across the link."""

    config: str
    shard_size: int
    predicted_s: float
    measured_s: float | None
    predicted_bytes: float
    crossed_bytes: float
    app_inter_bytes: int | None  # None: the app does not meter every phase that crosses


def _row(name: str, shard: int, m: LinkMeasurement, rate_mbit: float) -> LinkRow:
    strategy = CONFIGS[name].strategy
    seconds, nbytes = predict_link(strategy, link_hardware(rate_mbit), WORLD, shard, SAMPLES_PER_RANK, mlp_specs())
    metered = app_metered_phases(m.long.summary)
    app = m.app_inter_node_per_step if "grad_reduce" in metered else None
    return LinkRow(name, shard, seconds, m.step_time_s, nbytes, m.crossed_per_step, app)


def _mb(value: float | None) -> str:
    return "— (not metered)" if value is None else f"{value / 1e6:,.3f}"


def _ratio(flat: float | None, hier: float | None) -> str:
    return f"{flat / hier:.2f} ×" if flat and hier else "—"


def format_rows(rows: Sequence[LinkRow]) -> str:
    """The Markdown table of docs/benchmarks.md (bytes in MB = 10⁶ B, both directions)."""
    titles = ["config", "S", "predicted ms", "measured ms", "time error", "predicted MB across", "veth MB across"]
    titles += ["bytes error", "app inter-node MB"]
    measured = [
        (
            r.config,
            r.shard_size,
            f"{r.predicted_s * 1e3:,.1f}",
            "—" if r.measured_s is None else f"{r.measured_s * 1e3:,.1f}",
            error_percent(r.predicted_s, r.measured_s),
            _mb(r.predicted_bytes),
            _mb(r.crossed_bytes),
            error_percent(r.predicted_bytes, r.crossed_bytes),
            _mb(r.app_inter_bytes),
        )
        for r in rows
    ]
    gains = []
    for name in dict.fromkeys(r.config for r in rows):
        pair = {r.shard_size: r for r in rows if r.config == name}
        if set(pair) == {2, 4}:
            flat, hier = pair[4], pair[2]
            gains.append(
                (
                    name,
                    _ratio(flat.predicted_s, hier.predicted_s),
                    _ratio(flat.measured_s, hier.measured_s),
                    _ratio(flat.predicted_bytes, hier.predicted_bytes),
                    _ratio(flat.crossed_bytes, hier.crossed_bytes),
                )
            )
    ratios = ["config", "S=W ÷ S=node: predicted time", "measured time", "predicted bytes", "veth bytes"]
    return markdown_table(titles, "lrrrrrrrr", measured) + "\n\n" + markdown_table(ratios, "lrrrr", gains)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--rate-mbit", type=float, default=100.0, help="the link's rate each way (tbf)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--short", type=int, default=3, help="steps of the shorter run")
    parser.add_argument("--long", type=int, default=10, help="steps of the longer run (its median step is timed)")
    parser.add_argument("--out", help="also write the table (Markdown) here")
    parser.add_argument("--keep", help="keep the runs' dirs under this folder (default: a temp dir, removed)")
    return parser.parse_args(argv)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> list[LinkRow]:
    args = parse_args(argv)
    why = unavailable()
    if why:
        raise SystemExit(f"bench_link: {why}")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # cleaned up like a Ctrl-C
    command = command_line("scripts/bench_link.py", argv)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_link_") as scratch, TwoNodes.create(args.rate_mbit) as nodes:
        root = Path(args.keep or scratch)
        for name in args.configs:
            for given, shard in SHARDS.items():
                overrides = ("logger=none", "progress=false", *CONFIGS[name].overrides, f"dist.shard_size={given}")
                m = measure_link(nodes, overrides, args.short, args.long, root / f"{name}_s{shard}")
                rows.append(_row(name, shard, m, args.rate_mbit))
                print(format_rows(rows[-1:]).splitlines()[2], flush=True)
    load = os.getloadavg()[0]
    header = (
        f"`{command}` — {started}, veth {args.rate_mbit:g} Mbit/s each way, W=4 as 2 nodes × 2 ranks; "
        f"load average {load:.1f} at the end on {os.cpu_count()} cores"
    )
    text = header + "\n\n" + format_rows(rows) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, lambda f: f.write(text.encode("utf-8")))
    return rows
