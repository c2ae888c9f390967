"""The report's pure logic on fabricated run dirs: labels that never merge, failed runs with
their reasons, ÷ DDP from a run or the planner, scaled units, and the files it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
import yaml

from zero_lab.report import write_report
from zero_lab.report.noise import noise_notes
from zero_lab.report.plots import IDEAL_STYLE, MEMORY_TITLE, memory_figure, plot_time
from zero_lab.report.runs import find_runs, parse_overrides, percentile
from zero_lab.report.table import COLUMNS, format_bytes, format_ms, table_rows

COLUMN = {column.title: index for index, column in enumerate(COLUMNS)}


def make_run(
    path: Path,
    overrides: list[str],
    *,
    optim: str = "zero_adam",
    world: int = 2,
    state: list[float] | None = None,
    steps: int = 4,
    losses: list[float] | None = None,
    summary: bool = True,
    per_step: dict[str, list[float]] | None = None,
    **fields: Any,
) -> Path:
    """A run dir as the app writes it: .hydra/, meta.json, metrics.jsonl, summary.json."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"steps": steps, "param_dtype": "float32", "optim": {"lr": 0.001, "master_weights": False}}
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    meta = {"argv": ["train.py", "-m", *overrides], "overrides": overrides, "git": {"rev": "ab" * 20, "dirty": False}}
    meta |= {"choices": {"optim": optim, "model": "mlp"}, "host": "testhost", "torch": "2.x"}
    (path / "meta.json").write_text(json.dumps(meta))
    losses = losses if losses is not None else [1.0 / (s + 1) for s in range(steps)]
    state = state if state is not None else [100.0 * world] * world
    rows = [
        {
            "step": s,
            "train/loss": loss,
            "time/step_s/max": 0.010 + 0.001 * s,
            "time/exchange_s/max": 0.002,
            "comm/exchange_bytes/max": 4096.0,
            "train/samples_per_s": 1000.0,
        }
        | {key: values[s] for key, values in (per_step or {}).items()}
        for s, loss in enumerate(losses)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        values = {
            "final_loss": losses[-1],
            "losses": losses,
            "world_size": world,
            "steps": steps,
            "zero": optim.startswith("zero_"),
            "model_params": 1000,
            "param_dtype": "float32",
            "optim_state_bytes": state,
            "tensor_bytes": [3000.0] * world,
            "peak_bytes": [300 * 2**20] * world,
            "imbalance": 1.0,
            "stopped_by": None,
        }
        (path / "summary.json").write_text(json.dumps(values | fields))
    return path


def test_overrides_parse_into_keys_without_hydras_own():
    parsed = parse_overrides(["optim=adam", "+x.y=1", "~z", "hydra.run.dir=/tmp/a", "a='b=c'", "hydra/launcher=slurm"])
    assert parsed == {"optim": "adam", "x.y": "1", "z": "<deleted>", "a": "'b=c'"}  # read by Hydra's parser
    assert parse_overrides(["a=b=c"]) == {"a=b=c": "<unparsed>"}  # Hydra refuses it: the line is its label


def test_every_run_is_labelled_by_the_overrides_that_differ_and_none_merge(tmp_path):
    # what a -m sweep saves in .hydra/overrides.yaml: `optim.master_weights=true,false` becomes True / False
    for job, (dtype, master) in enumerate([(d, m) for d in ("float32", "bfloat16") for m in ("True", "False")]):
        make_run(tmp_path / str(job), [f"param_dtype={dtype}", f"optim.master_weights={master}", "steps=4"])
    runs, failed = find_runs(tmp_path)
    assert failed == []
    assert sorted(run.label for run in runs) == [
        "optim.master_weights=false param_dtype=bfloat16",
        "optim.master_weights=false param_dtype=float32",
        "optim.master_weights=true param_dtype=bfloat16",
        "optim.master_weights=true param_dtype=float32",
    ]  # steps=4 is common to all: not part of any label
    rows = table_rows(runs)
    assert len(rows) == 4 and len({row[COLUMN["run"]].text for row in rows}) == 4


def test_a_key_some_runs_leave_alone_shows_their_own_value(tmp_path):
    make_run(tmp_path / "a", ["optim=adam"], optim="adam")
    make_run(tmp_path / "b", [], optim="zero_adam")  # the default: optim from its group choice
    make_run(tmp_path / "c", ["steps=8"], steps=8)  # steps from its resolved config
    labels = {run.path.name: run.label for run in find_runs(tmp_path)[0]}
    assert labels == {"a": "optim=adam steps=4", "b": "optim=zero_adam steps=4", "c": "optim=zero_adam steps=8"}


def test_a_boolean_override_equal_to_the_default_sets_no_run_apart(tmp_path):
    make_run(tmp_path / "a", ["optim.master_weights=False", "optim=adam"], optim="adam")
    make_run(tmp_path / "b", [], optim="zero_adam")  # master_weights: false from its config
    labels = {run.path.name: run.label for run in find_runs(tmp_path)[0]}
    assert labels == {"a": "optim=adam", "b": "optim=zero_adam"}


def test_runs_with_the_same_overrides_are_told_apart_by_their_dir(tmp_path):
    make_run(tmp_path / "monday" / "0", ["optim=adam"], optim="adam")
    make_run(tmp_path / "tuesday" / "0", ["optim=adam"], optim="adam", losses=[2.0, 1.0, 0.5, 0.25])
    labels = sorted(run.label for run in find_runs(tmp_path)[0])
    assert labels == ["monday/0", "tuesday/0"]


def test_dimensions_that_only_change_the_world_size_share_a_series(tmp_path):
    for world in (1, 2, 4):
        make_run(tmp_path / f"w{world}", ["optim=zero_adam", f"dist.world_size={world}"], world=world)
        make_run(tmp_path / f"a{world}", ["optim=adam", f"dist.world_size={world}"], optim="adam", world=world)
    runs, _ = find_runs(tmp_path)
    assert {run.series for run in runs} == {"optim=adam", "optim=zero_adam"}
    assert len({run.label for run in runs}) == 6


def test_failed_and_incomplete_runs_are_listed_with_their_reason(tmp_path):
    make_run(tmp_path / "ok", ["seed=0"])
    crashed = make_run(tmp_path / "crashed", ["seed=1"], summary=False)
    (crashed / "logs").mkdir()
    (crashed / "logs" / "rank1.error.txt").write_text("Traceback ...\nRuntimeError: boom at step 2\n")
    make_run(tmp_path / "killed", ["seed=2"], summary=False)
    make_run(tmp_path / "stopped", ["seed=3"], losses=[1.0, 0.5], stopped_by="SIGTERM")
    never = make_run(tmp_path / "never", ["seed=4"], summary=False)
    (never / "metrics.jsonl").unlink()
    runs, failed = find_runs(tmp_path)
    assert [run.label for run in runs] == ["seed=0"]
    reasons = {f.label: f.reason for f in failed}
    assert reasons == {
        "seed=1": "rank 1 failed: RuntimeError: boom at step 2",
        "seed=2": "no summary.json: 4 of 4 steps logged, then it ended (killed?)",
        "seed=3": "stopped by SIGTERM after 2 of 4 steps",
        "seed=4": "no summary.json and no metrics: the job never started training (or is still starting)",
    }


def test_a_long_failure_reason_is_cut_visibly(tmp_path):
    crashed = make_run(tmp_path / "crashed", ["seed=1"], summary=False)
    (crashed / "logs").mkdir()
    (crashed / "logs" / "rank0.error.txt").write_text("Traceback ...\nCheckpointError: " + "x" * 400 + "\n")
    (failed,) = find_runs(tmp_path)[1]
    assert failed.reason == "rank 0 failed: CheckpointError: " + "x" * (299 - len("CheckpointError: ")) + "…"


def test_units_scale_to_the_value():
    assert [format_bytes(v) for v in (0, 500, 33548, 2**20, 1.5 * 2**30, None)] == [
        "0 B",
        "500 B",
        "32.8 KiB",
        "1.00 MiB",
        "1.50 GiB",
        "–",
    ]
    assert [format_ms(v) for v in (0.0, 0.000250, 0.00942, 0.1234, 2.5)] == [
        "0 ms",
        "250 µs",
        "9.42 ms",
        "123 ms",
        "2500 ms",
    ]


def test_state_is_divided_by_the_sweeps_ddp_run_else_by_the_planners_prediction(tmp_path):
    make_run(tmp_path / "adam", ["optim=adam"], optim="adam", state=[1000.0, 1000.0])
    make_run(tmp_path / "zero", ["optim=zero_adam"], state=[520.0, 480.0], ddp_state_bytes=4000.0, imbalance=1.04)
    runs, _ = find_runs(tmp_path)
    cells = {run.label: row for run, row in zip(runs, table_rows(runs))}
    zero = cells["optim=zero_adam"]
    assert (zero[COLUMN["÷ DDP"]].text, zero[COLUMN["÷ ideal 1/W"]].text) == ("0.52", "1.04")  # measured DDP
    assert (zero[COLUMN["state/rank max"]].text, zero[COLUMN["state/rank min"]].text) == ("520 B", "480 B")
    assert cells["optim=adam"][COLUMN["÷ ideal 1/W"]].text == "2.00"  # DDP holds W times the ideal share

    (tmp_path / "adam" / "summary.json").unlink()  # no DDP run left: the planner's number
    runs, _ = find_runs(tmp_path)
    (row,) = table_rows(runs)
    assert (row[COLUMN["÷ DDP"]].text, row[COLUMN["÷ DDP"]].sort) == ("0.13 (plan)", 520 / 4000)


def test_percentile_interpolates():
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 0.9) == pytest.approx(10.0)


def test_write_report_lists_every_run_links_its_dir_and_embeds_the_plots(tmp_path):
    make_run(tmp_path / "sweep" / "0", ["param_dtype=float32"])
    make_run(tmp_path / "sweep" / "1", ["param_dtype=bfloat16"])
    make_run(tmp_path / "sweep" / "2", ["param_dtype=float16"], summary=False)
    out = tmp_path / "out"
    runs, failed = write_report(tmp_path / "sweep", out)
    assert (len(runs), len(failed)) == (2, 1)
    text = (out / "report.md").read_text()
    assert "[param_dtype=bfloat16](../sweep/1/)" in text and "[param_dtype=float32](../sweep/0/)" in text
    assert "[param_dtype=float16](../sweep/2/): no summary.json: 4 of 4 steps logged" in text
    assert "python train.py -m param_dtype=float32" in text and "abababababab" in text and "testhost" in text
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    assert 'href="../sweep/2/"' in page


def test_a_dir_without_runs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no runs under"):
        write_report(tmp_path, tmp_path / "out")


def test_the_time_plot_gives_every_run_a_row_of_its_own(tmp_path):
    """Long labels of many runs: one horizontal bar each, so the figure grows in height, not width."""
    shapes = []
    for count in (2, 10):
        for job in range(count):
            overrides = [f"dist.world_size={2 + job}", "optim=zero_adam", f"partitioner=sorted_greedy_{job}"]
            make_run(tmp_path / str(count) / str(job), overrides, world=2 + job)
        plot_time(find_runs(tmp_path / str(count))[0], tmp_path / f"time{count}.png")
        shapes.append(matplotlib.image.imread(tmp_path / f"time{count}.png").shape)
    (low, width), (high, same_width) = (shape[:2] for shape in shapes)
    assert width == same_width and high > low + 8 * 0.5 * 110  # ≥ half an inch per added run, at the report's dpi


def test_the_memory_plots_key_names_the_lines_drawn(tmp_path):
    """Four ZeRO series and a DDP run: the only dotted line is the black ideal DDP / W, so the
    title's "black dotted: ideal DDP / W" cannot point at a series (the 4th once was red dotted)."""
    for job, partitioner in enumerate(("sorted_greedy", "flat", "greedy", "round_robin")):
        for world in (2, 4):
            overrides = ["optim=zero_adam", f"partitioner={partitioner}", f"dist.world_size={world}"]
            make_run(tmp_path / f"{job}-{world}", overrides, world=world, state=[1000.0 / world + job] * world)
    make_run(
        tmp_path / "ddp", ["optim=adam", "partitioner=flat", "dist.world_size=2"], optim="adam", state=[1000.0] * 2
    )
    figure = memory_figure(find_runs(tmp_path)[0])
    (ax,) = figure.axes
    assert ax.get_title() == MEMORY_TITLE and "black dotted: ideal DDP / W" in MEMORY_TITLE
    drawn = [line for line in ax.lines if line.get_xdata().size]  # legend-only entries have no data
    dotted = [line for line in drawn if line.get_linestyle() == IDEAL_STYLE["linestyle"]]
    assert [line.get_label() for line in dotted] == ["ideal: DDP / W (DDP = 1e+03 B)"]
    assert dotted[0].get_color() == "black"
    series = [line for line in drawn if line not in dotted]
    assert len(series) == 5 and all(line.get_color() not in ("black", "C7") for line in series)
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend[-1] == "ideal: DDP / W (DDP = 1e+03 B)" and len(legend) == 6


def test_report_md_says_what_every_column_means(tmp_path):
    make_run(tmp_path / "sweep" / "0", ["seed=0"])
    make_run(tmp_path / "sweep" / "1", ["seed=1"])
    write_report(tmp_path / "sweep", tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    legend = text.split("### What the columns mean\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert legend == [f"- **{column.title}**: {column.help}" for column in COLUMNS]
    assert "- **÷ ideal 1/W**: state max / (DDP's state / W); 1.00 is a perfect split" in legend


def _ratio_steps(ratios: list[float]) -> dict[str, list[float]]:
    """Per-step local optimizer step records whose slowest ÷ mean is ``ratios``."""
    return {"time/optim_step_s/max": [0.01 * r for r in ratios], "time/optim_step_s/mean": [0.01] * len(ratios)}


def test_a_comparison_within_step_to_step_noise_is_called_so(tmp_path):
    """Muon's cost models on a loaded machine: medians 1.20 vs 1.25, but the steps scatter over
    both; a third run whose steps never reach them is not part of the note."""
    steps = 6  # the first is left out: five timed steps each
    flat = [1.0, 1.0, 1.0, 1.01, 1.01, 1.02]
    make_run(
        tmp_path / "numel",
        ["partitioner.cost=numel"],
        steps=steps,
        per_step=_ratio_steps([9, 1.1, 1.2, 1.5, 1.15, 1.3]),
    )
    make_run(
        tmp_path / "ns",
        ["partitioner.cost=newton_schulz"],
        steps=steps,
        per_step=_ratio_steps([9, 1.0, 1.25, 1.4, 1.2, 1.3]),
    )
    make_run(tmp_path / "flat", ["partitioner.cost=flat"], steps=steps, per_step=_ratio_steps([9, *flat[1:]]))
    notes = [note for note in noise_notes(find_runs(tmp_path)[0]) if note.startswith("slowest ÷ mean")]
    assert notes == [
        "slowest ÷ mean at W=2 is within noise for 2 runs, whose step-to-step ranges overlap: "
        "partitioner.cost=numel: 1.20 (p10–p90 1.12–1.42); "
        "partitioner.cost=newton_schulz: 1.25 (p10–p90 1.08–1.36). "
        "Their order here is not a result; more steps or a quieter machine separate them."
    ]
    write_report(tmp_path, tmp_path / "out")
    assert f"- {notes[0]}" in (tmp_path / "out" / "report.md").read_text()
    assert '<h2>Within noise</h2><ul id="noise">' in (tmp_path / "out" / "report.html").read_text()


def test_the_html_table_wraps_and_scrolls_in_its_own_box(tmp_path):
    """17 columns do not fit 1400 px unwrapped: headers and labels wrap, the rest scrolls inside
    the table's box (the page itself never gets wider; the browser test measures it)."""
    make_run(tmp_path / "sweep" / "0", ["seed=0"])
    write_report(tmp_path / "sweep", tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert '<div class="scroll"><table class="sortable" id="runs">' in page
    assert (
        "div.scroll{max-width:100%;overflow-x:auto}" in page
        and "th{background:#f1f1f1;cursor:pointer;user-select:none;min-width:3em;max-width:6.5em}" in page
    )
