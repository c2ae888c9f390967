"""One self-contained HTML page: provenance, a sortable table, the runs that failed, the plots.

The table fits a laptop window: headers wrap (≤ 6.5em each), run labels wrap (≤ 20em), and
whatever is still wider scrolls inside its own box, never the page. Below it: what the
columns mean and the timing comparisons within noise (:mod:`zero_lab.report.noise`).

Offline by construction: the CSS and the sorting script are inline, the PNGs are embedded
as base64 ``data:`` URIs, and the only links are relative paths to the run dirs. Sorting:
a click on a column header sorts by the cells' ``data-sort`` values (numbers numerically,
text alphabetically, missing values last); a second click reverses.
"""

from __future__ import annotations

import base64
import html
import os
import platform
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from zero_lab.report.noise import noise_notes
from zero_lab.report.runs import Failed, Run, run_date
from zero_lab.report.table import COLUMNS, Cell

__all__ = ["html_page", "provenance"]

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em 1.25em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}
div.scroll{max-width:100%;overflow-x:auto}
td,th{border:1px solid #ccc;padding:4px 6px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.text{min-width:10em;max-width:20em;overflow-wrap:anywhere}
th{background:#f1f1f1;cursor:pointer;user-select:none;min-width:3em;max-width:6.5em}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
table.meta th{cursor:default}
figure{margin:1em 0}figcaption{font-size:13px;color:#555}img{max-width:100%;border:1px solid #eee}
.failed{color:#a00}
"""

_SCRIPT = """
function sortKey(td){const v=td.dataset.sort;if(v===undefined||v==='')return null;
  const n=Number(v);return Number.isNaN(n)?v:n;}
function compare(a,b){if(a===null)return b===null?0:1;if(b===null)return -1;
  if(typeof a==='number'&&typeof b==='number')return a-b;return String(a).localeCompare(String(b));}
document.querySelectorAll('table.sortable').forEach(table=>{
  table.querySelectorAll('th').forEach((th,col)=>th.addEventListener('click',()=>{
    const dir=th.getAttribute('aria-sort')==='ascending'?'descending':'ascending';
    table.querySelectorAll('th').forEach(h=>h.removeAttribute('aria-sort'));
    th.setAttribute('aria-sort',dir);
    const body=table.tBodies[0];const rows=Array.from(body.rows);
    rows.sort((r1,r2)=>{const c=compare(sortKey(r1.cells[col]),sortKey(r2.cells[col]));
      return dir==='ascending'?c:-c;});
    rows.forEach(r=>body.appendChild(r));}));});
"""


def _href(path: str | Path, out: Path) -> str:
    return html.escape(Path(os.path.relpath(path, out)).as_posix() + "/", quote=True)


def _cell(cell: Cell, out: Path) -> str:
    sort = "" if cell.sort is None else html.escape(str(cell.sort), quote=True)
    text = html.escape(cell.text)
    if cell.link:
        text = f'<a href="{_href(cell.link, out)}">{text}</a>'
    return f'<td class="{"num" if cell.numeric else "text"}" data-sort="{sort}">{text}</td>'


def _table(rows: list[list[Cell]], out: Path) -> str:
    head = "".join(f'<th title="{html.escape(c.help, quote=True)}">{html.escape(c.title)}</th>' for c in COLUMNS)
    body = "".join("<tr>" + "".join(_cell(cell, out) for cell in row) + "</tr>" for row in rows)
    table = f'<table class="sortable" id="runs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    return f'<div class="scroll">{table}</div>'  # headers and labels wrap; the rest scrolls inside the box


def _git(meta: dict) -> str:
    git = meta.get("git") or {}
    if not git.get("rev"):
        return "unknown"
    return str(git["rev"])[:12] + (" (local changes)" if git.get("dirty") else "")


def provenance(runs: list[Run], failed: list[Failed], root: Path) -> list[tuple[str, str]]:
    """``(what, value)`` rows: the sweep's command, git revision, dates, machine, report time."""
    everything: list[Run | Failed] = [*runs, *failed]
    metas = [run.meta for run in everything if run.meta]
    commands = sorted({"python " + " ".join(m["argv"]) for m in metas if m.get("argv")})
    dates = sorted(d for run in everything if (d := run_date(run)) is not None)
    when = "unknown"
    if dates:
        first, last = (d.strftime("%Y-%m-%d %H:%M:%S UTC") for d in (dates[0], dates[-1]))
        when = first if first == last else f"{first} – {last}"
    hosts = sorted({f"{m.get('host', '?')} (torch {m.get('torch', '?')})" for m in metas})
    return [
        ("runs", f"{len(runs)} complete, {len(failed)} failed or incomplete, under {root}"),
        ("command", "\n".join(commands) or "unknown (no meta.json)"),
        ("git revision", ", ".join(sorted({_git(m) for m in metas})) or "unknown"),
        ("started", when),
        ("machine", ", ".join(hosts) or "unknown"),
        ("report", f"{datetime.now(tz=UTC).strftime('%Y-%m-%d %H:%M:%S UTC')} on {platform.node()}"),
    ]


def _failed(failed: list[Failed], out: Path) -> str:
    if not failed:
        return ""
    items = "".join(
        f'<li><a href="{_href(f.path, out)}">{html.escape(f.label)}</a>: {html.escape(f.reason)}</li>' for f in failed
    )
    title = f"Failed or incomplete runs ({len(failed)}), not in the table or plots"
    return f'<h2 class="failed">{title}</h2><ul id="failed">{items}</ul>'


def _repeats(repeats: Sequence[tuple[Path, str]], out: Path) -> str:
    """Sweep jobs that repeated an earlier one (``(run dir, note)``), not run again."""
    if not repeats:
        return ""
    items = "".join(
        f'<li><a href="{_href(path, out)}">{html.escape(path.name)}</a>: {html.escape(note)}</li>'
        for path, note in repeats
    )
    title = f"Repeats ({len(repeats)}): merged into the run they repeat, not run again"
    return f"<h2>{title}</h2><ul id='repeats'>{items}</ul>"


def _noise(runs: list[Run]) -> str:
    notes = noise_notes(runs)
    if not notes:
        return ""
    items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    return f'<h2>Within noise</h2><ul id="noise">{items}</ul>'


def html_page(
    runs: list[Run],
    failed: list[Failed],
    rows: list[list[Cell]],
    root: Path,
    out: Path,
    figures: dict[str, str],
    repeats: Sequence[tuple[Path, str]] = (),
) -> str:
    """The page; ``figures`` maps each PNG (in ``out``) to its caption; ``repeats``: the sweep
    jobs not run because they repeated another (run dir, note)."""
    meta = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v).replace(chr(10), '<br>')}</td></tr>"
        for k, v in provenance(runs, failed, root)
    )
    images = "".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode((out / name).read_bytes()).decode()}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for name, caption in figures.items()
        if (out / name).exists()
    )
    legend = "".join(f"<li><b>{html.escape(c.title)}</b>: {html.escape(c.help)}</li>" for c in COLUMNS)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>zero_lab report: {html.escape(root.name)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>zero_lab report</h1><table class='meta' id='provenance'>{meta}</table>"
        f"<h2>Runs (click a column to sort)</h2>{_table(rows, out)}"
        f"<details><summary>What the columns mean</summary><ul>{legend}</ul></details>{_noise(runs)}"
        f"{_repeats(repeats, out)}{_failed(failed, out)}"
        f"<h2>Plots</h2>{images}<script>{_SCRIPT}</script></body></html>\n"
    )
