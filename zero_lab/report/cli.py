"""Write the report files for a run or sweep dir, and the command line around it.

``write_report(root, out)`` writes into ``out``:

* ``report.md``   — provenance, the table (run names link to the run dirs), what its
  columns mean, the timing comparisons within noise (:mod:`zero_lab.report.noise`),
  failed runs;
* ``memory.png``, ``time.png``, ``loss.png`` — see :mod:`zero_lab.report.plots`;
* ``report.html`` — all of it on one offline page with a sortable table.

The command prints the table and every failed or incomplete run with its reason, and
exits 1 when the dir holds no run at all.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from zero_lab.report.noise import noise_notes
from zero_lab.report.page import html_page, provenance
from zero_lab.report.plots import PLOTS
from zero_lab.report.runs import Failed, Repeat, Run, find_repeats, find_runs
from zero_lab.report.table import legend_lines, markdown, table_rows

__all__ = ["CAPTIONS", "main", "write_report"]

CAPTIONS = {
    "memory.png": "Optimizer state per rank vs world size: a coloured line per series through its fullest rank; "
    "the black dotted curve is the ideal DDP state / W.",
    "time.png": "Median step time per run, split into compute and parameter exchange; whiskers p10–p90.",
    "loss.png": "Loss per step of every run; coinciding curves are drawn in different styles.",
}


def _markdown_report(runs: list[Run], failed: list[Failed], root: Path, out: Path) -> str:
    def relative(path: str | Path) -> str:
        return Path(os.path.relpath(path, out)).as_posix() + "/"

    lines = [f"# zero_lab report: {root}", ""]
    lines += [f"- {what}: {value.replace(chr(10), '; ')}" for what, value in provenance(runs, failed, root)]
    lines += ["", markdown(table_rows(runs), relative)]
    lines += ["### What the columns mean", "", *legend_lines(), ""]
    notes = noise_notes(runs)
    if notes:
        lines += ["### Within noise", "", *(f"- {note}" for note in notes), ""]
    if repeats := find_repeats(root, runs):
        lines += [f"## Repeats ({len(repeats)}): merged into the run they repeat, not run again", ""]
        lines += [f"- [{r.path.name}]({relative(r.path)}): {repeat_note(r)}" for r in repeats]
        lines.append("")
    if failed:
        lines += [f"## Failed or incomplete runs ({len(failed)}), not in the table or plots", ""]
        lines += [f"- [{f.label}]({relative(f.path)}): {f.reason}" for f in failed]
        lines.append("")
    return "\n".join(lines)


def repeat_note(repeat: Repeat) -> str:
    """``the same run as `optim=adam dist.world_size=2` (partitioner=flat: not used by its optimizer)``."""
    why = f" ({' '.join(repeat.not_used)}: not used by its optimizer)" if repeat.not_used else " (the same config)"
    return f"the same run as `{repeat.label}`{why}"


def write_report(root: Path, out: Path) -> tuple[list[Run], list[Failed]]:
    """Find the runs below ``root`` and write the report files into ``out``."""
    root, out = root.resolve(), out.resolve()
    if not root.is_dir():
        raise SystemExit(f"report: {root} is not a directory (give a run dir or a sweep dir)")
    runs, failed = find_runs(root)
    if not runs and not failed:
        raise SystemExit(f"report: no runs under {root} (a run dir holds meta.json, .hydra/ or summary.json)")
    out.mkdir(parents=True, exist_ok=True)
    figures = {}
    if runs:
        for name, plot in PLOTS.items():
            plot(runs, out / name)
            figures[name] = CAPTIONS[name]
    _write(out / "report.md", _markdown_report(runs, failed, root, out))
    notes = [(r.path, repeat_note(r)) for r in find_repeats(root, runs)]
    _write(out / "report.html", html_page(runs, failed, table_rows(runs), root, out, figures, repeats=notes))
    return runs, failed


def _write(path: Path, text: str) -> None:
    """Atomically: a reader never sees half a report."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zero_lab.report", description=__doc__.split("\n")[0])
    parser.add_argument("path", type=Path, help="a run dir or a sweep dir")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: <path>/report)")
    args = parser.parse_args(argv)
    out = args.out or args.path / "report"
    runs, failed = write_report(args.path, out)
    print(_markdown_report(runs, failed, args.path.resolve(), out.resolve()))
    files = ", ".join([*(PLOTS if runs else ()), "report.md", "report.html"])
    print(f"report: {len(runs)} run(s), {len(failed)} failed or incomplete; wrote {files} to {out}")
    return 0
