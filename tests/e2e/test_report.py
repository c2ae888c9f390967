"""``scripts/report.py`` on a real 2-job sweep and on a single run: table, PNGs, one HTML page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from tests.e2e.runs import REPO, summary

PLOTS = ("memory.png", "time.png", "loss.png")


def report(path: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/report.py", str(path), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def sweep_report(sweep, tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("report")
    result = report(sweep, out)
    assert result.returncode == 0, result.stderr
    return sweep, out


def test_table_has_one_row_per_job_with_measured_numbers(sweep_report):
    sweep, out = sweep_report
    lines = (out / "report.md").read_text().splitlines()
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| ") and "strategy" not in line]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("adam", "2"), ("zero_adam/sorted_greedy", "2")]
    adam_mib, zero_mib = (float(r[2]) for r in rows)
    assert zero_mib == pytest.approx(adam_mib / 2, rel=0.05)
    final = {r[0].strip(): float(r[9]) for r in rows}
    assert final["adam"] == pytest.approx(summary(sweep / "0")["final_loss"], rel=1e-5)


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
    assert "http://" not in page and "https://" not in page
    assert "<table>" in page and "zero_adam/sorted_greedy" in page


def test_report_on_a_single_run_dir(default_run, tmp_path):
    result = report(default_run, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "report: 1 run(s)" in result.stdout
    assert all((tmp_path / name).is_file() for name in (*PLOTS, "report.md", "report.html"))


def test_report_on_a_dir_without_runs_fails_clearly(tmp_path):
    result = report(tmp_path, tmp_path / "out")
    assert result.returncode != 0 and "no runs under" in result.stderr
