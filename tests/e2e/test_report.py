"""The report on real runs: the Adam vs ZeRO-Adam sweep, a ``param_dtype`` sweep beside a run
that failed, a single run; the HTML page opened, sorted and followed in real headless Chromium."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import matplotlib.image
import pytest

from tests.e2e.browser import Chromium, find_chromium
from tests.e2e.runs import REPO, run_once, summary, together, train
from zero_lab.report.table import COLUMNS, format_bytes

PLOTS = ("memory.png", "time.png", "loss.png")
TITLES = [column.title for column in COLUMNS]


def report(path: Path, out: Path, *, module: bool = False) -> subprocess.CompletedProcess[str]:
    command = ["-m", "zero_lab.report"] if module else ["scripts/report.py"]
    return subprocess.run(
        [sys.executable, *command, str(path), "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def table(out: Path) -> dict[str, dict[str, str]]:
    """report.md's table: run label -> {column title: cell text}."""
    lines = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].split(" | ")]
    assert header[0] == "| run" and len(header) == len(TITLES)
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\) \| ", line.strip("| "))]
        label = re.fullmatch(r"\[(.*)\]\(.*\)", cells[0]).group(1)  # the run column links to the run dir
        rows[label] = dict(zip(TITLES, cells))
    return rows


@pytest.fixture(scope="module")
def reports(sweep, default_run, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """name -> (result, out dir) of ``scripts/report.py`` on the session's sweep, on its default
    run, and on a dir without runs; independent, so made together (two at a time)."""
    base = tmp_path_factory.mktemp("report")
    empty = base / "empty"
    empty.mkdir()
    inputs = {"sweep": sweep, "single": default_run, "empty": empty}
    calls = [functools.partial(report, path, base / f"{name}-out") for name, path in inputs.items()]
    return {name: (result, base / f"{name}-out") for name, result in zip(inputs, together(*calls))}


@pytest.fixture(scope="module")
def sweep_report(sweep, reports) -> tuple[Path, Path]:
    result, out = reports["sweep"]
    assert result.returncode == 0, result.stderr
    return sweep, out


@pytest.fixture(scope="module")
def dtype_report(tmp_path_factory) -> tuple[Path, Path]:
    """``-m param_dtype=float32,bfloat16`` (same strategy: only the override tells them apart)
    plus, in the same dir, a run whose ranks fail (a corrupt checkpoint to resume from)."""
    base = tmp_path_factory.getbasetemp() / "dtype"
    root = run_once(base, "sweep", "param_dtype=float32,bfloat16", "steps=4", "logger=none", multirun=True)
    bogus = base / "bogus.pt"
    bogus.write_bytes(b"not a checkpoint")
    failed = train("param_dtype=float32", "steps=4", "logger=none", f"resume={bogus}", f"hydra.run.dir={root / '2'}")
    assert failed.returncode == 1, failed.stderr
    out = base / "report"
    result = report(root, out, module=True)
    assert result.returncode == 0, result.stderr
    return root, out


def test_runs_are_labelled_by_their_overrides_with_measured_numbers(sweep_report):
    sweep, out = sweep_report
    rows = table(out)
    assert sorted(rows) == ["optim=adam", "optim=zero_adam"]
    adam, zero = summary(sweep / "0"), summary(sweep / "1")
    assert rows["optim=adam"]["state/rank max"] == format_bytes(max(adam["optim_state_bytes"]))
    assert rows["optim=zero_adam"]["state/rank min"] == format_bytes(min(zero["optim_state_bytes"]))
    ratio = max(zero["optim_state_bytes"]) / max(adam["optim_state_bytes"])  # ÷ the DDP run of the sweep
    assert 0.49 < ratio < 0.52 and rows["optim=zero_adam"]["÷ DDP"] == f"{ratio:.2f}"
    assert rows["optim=adam"]["÷ ideal 1/W"] == "2.00"  # DDP holds W times the ideal share
    assert rows["optim=zero_adam"]["tensors/rank"] == format_bytes(max(zero["tensor_bytes"]))
    assert float(rows["optim=adam"]["final loss"]) == pytest.approx(adam["final_loss"], rel=1e-5)
    assert f"- **÷ DDP**: {COLUMNS[TITLES.index('÷ DDP')].help}" in (out / "report.md").read_text()  # the legend


def test_a_dtype_sweep_gives_one_row_per_run_and_lists_the_failed_one(dtype_report):
    root, out = dtype_report
    rows = table(out)
    assert sorted(rows) == ["param_dtype=bfloat16 resume=null", "param_dtype=float32 resume=null"]
    fp32, bf16 = summary(root / "0"), summary(root / "1")
    assert bf16["param_dtype"] == "bfloat16" and fp32["param_dtype"] == "float32"
    assert rows["param_dtype=bfloat16 resume=null"]["state/rank max"] == format_bytes(max(bf16["optim_state_bytes"]))
    assert rows["param_dtype=bfloat16 resume=null"]["÷ DDP"].endswith("(plan)")  # no DDP run in this sweep
    text = (out / "report.md").read_text()
    link = r"\[param_dtype=float32 resume=\S+bogus.pt\]\(\.\./app_runs/sweep/2/\)"
    # the exception line: checked loads refuse a checkpoint that comes without its size/sha256 record
    reason = r"rank \d failed: \S*CheckpointError: \S+bogus.pt: its size/sha256 record"
    failed = re.search(rf"^- {link}: {reason}", text, re.M)
    assert failed, text
    assert "python train.py -m param_dtype=float32,bfloat16 steps=4 logger=none" in text  # the sweep's command
    for name in PLOTS:
        assert (out / name).is_file()


def test_plots_are_real_pngs(sweep_report):
    _, out = sweep_report
    for name in PLOTS:
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 300 and image.shape[1] > 500  # rendered, not empty
        assert image[..., :3].std() > 0.05  # has content, not a blank canvas


def test_html_page_is_self_contained(sweep_report):
    _, out = sweep_report
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    assert "http://" not in page and "https://" not in page and "<script src" not in page


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_the_page_renders_sorts_and_links_in_headless_chromium(dtype_report, tmp_path):
    root, out = dtype_report
    rows_js = "Array.from(document.querySelectorAll('#runs tbody tr'))"
    with Chromium(tmp_path / "profile") as browser:
        page = browser.open((out / "report.html").as_uri())
        images = browser.evaluate(page, "Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
        assert len(images) == len(PLOTS) and min(images) > 500  # every PNG decoded
        assert browser.evaluate(page, f"{rows_js}.length") == 2
        metrics = {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False}
        browser.call("Emulation.setDeviceMetricsOverride", metrics, page)  # a laptop window
        assert (
            browser.evaluate(page, "document.documentElement.scrollWidth") <= 1400
        )  # the table fits or scrolls in its box
        align = "getComputedStyle(document.querySelector('#runs td.text')).textAlign"
        assert browser.evaluate(page, align) == "left"
        provenance = browser.evaluate(page, "document.querySelector('#provenance').innerText")
        assert "param_dtype=float32,bfloat16" in provenance and "git revision" in provenance

        column = TITLES.index("state/rank max")
        sort_keys = f"{rows_js}.map(r => Number(r.cells[{column}].dataset.sort))"
        browser.evaluate(page, f"document.querySelectorAll('#runs th')[{column}].click()")
        ascending = browser.evaluate(page, sort_keys)
        browser.evaluate(page, f"document.querySelectorAll('#runs th')[{column}].click()")
        descending = browser.evaluate(page, sort_keys)
        assert ascending == sorted(ascending) and descending == ascending[::-1] and ascending[0] < ascending[1]
        first = browser.evaluate(page, f"{rows_js}[0].cells[0].innerText")
        assert first.startswith("param_dtype=float32")  # fp32 state is the larger: first when descending

        hrefs = browser.evaluate(page, "Array.from(document.querySelectorAll('#runs a, #failed a')).map(a => a.href)")
        linked = {Path(unquote(urlparse(href).path)) for href in hrefs}
        assert {p.resolve() for p in linked} == {(root / job).resolve() for job in ("0", "1", "2")}
        browser.navigate(page, hrefs[0])  # follow a link: the run dir's listing
        assert "summary.json" in browser.evaluate(page, "document.body.innerText")


def test_report_on_a_single_run_dir(reports):
    result, out = reports["single"]
    assert result.returncode == 0, result.stderr
    assert "report: 1 run(s), 0 failed or incomplete" in result.stdout
    assert all((out / name).is_file() for name in (*PLOTS, "report.md", "report.html"))


def test_report_on_a_dir_without_runs_fails_clearly(reports):
    result, _ = reports["empty"]
    assert result.returncode != 0 and "no runs under" in result.stderr
