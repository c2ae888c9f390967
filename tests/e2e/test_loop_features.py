"""The loop's features through the real ``python train.py``: a warmup + cosine schedule,
accumulation and the validation loss in one run; its checkpoint resumed at step 3 ends
exactly like the uninterrupted run (the scheduler's state travels with the checkpoint);
``val/loss`` reaches metrics.jsonl, W&B and the report; the closing lines say what ran, and
a run whose progress bar draws on a terminal ends without a leaked-semaphore warning."""

from __future__ import annotations

import pytest

from tests.e2e.runs import metrics, summary, train, train_on_terminal, train_together, wandb_records
from tests.e2e.test_metrics import of_type
from zero_lab.report.runs import find_runs
from zero_lab.report.table import COLUMNS, table_rows

FEATURES = ("scheduler=cosine", "scheduler.warmup_steps=2", "accumulate=2", "eval_every=3", "steps=6")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("features")
    code, stdout, terminal = train_on_terminal(
        *FEATURES, "checkpoint_every=3", "logger=wandb", f"hydra.run.dir={base / 'first'}"
    )  # as in an interactive shell: the progress bar draws
    assert code == 0, terminal[-3000:]
    (base / "first.stdout").write_text(stdout)
    (base / "first.terminal").write_text(terminal)
    resumed = train(*FEATURES, f"resume={base / 'first' / 'checkpoints' / 'step_00000003'}", "logger=none",
                    f"hydra.run.dir={base / 'resumed'}")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (base / "resumed.stdout").write_text(resumed.stdout)
    return base


def test_a_scheduled_accumulated_run_resumes_exactly(runs):
    original, resumed = summary(runs / "first"), summary(runs / "resumed")
    assert resumed["start_step"] == 3
    assert resumed["losses"] == original["losses"]
    assert resumed["param_checksum"] == original["param_checksum"]
    assert resumed["final_val_loss"] == original["final_val_loss"]
    lrs = [r["train/lr"] for r in metrics(runs / "first")]
    assert lrs[0] == pytest.approx(2 / 3 * 1e-3) and lrs[1] == pytest.approx(1e-3)  # warmup 1/3, 2/3, then 1
    assert [r["train/lr"] for r in metrics(runs / "resumed")] == lrs[3:]
    assert original["accumulate"] == 2


def test_the_closing_lines_say_what_ran_and_an_interactive_run_ends_without_a_warning(runs):
    first, resumed = summary(runs / "first"), summary(runs / "resumed")
    logged = [r["val/loss"] for r in metrics(runs / "first") if "val/loss" in r]
    shown = (runs / "first.stdout").read_text().splitlines()
    start = next(i for i, line in enumerate(shown) if line.startswith("zero_lab: final loss"))
    assert shown[start + 1 : start + 3] == [
        "  accumulate=2: each step summed 2 micro-batches per rank",
        f"  validation loss: final {logged[-1]:.6g}, best {min(logged):.6g} (eval_every=3, 2 batches each)",
    ]
    assert (first["best_val_loss"], first["eval_every"], first["eval_batches"]) == (min(logged), 3, 2)
    again = (runs / "resumed.stdout").read_text().splitlines()
    start = next(i for i, line in enumerate(again) if line.startswith("zero_lab: final loss"))
    step_dir = runs / "first" / "checkpoints" / "step_00000003"
    assert again[start].startswith("zero_lab: final loss") and " after 6 steps " in again[start]
    assert again[start + 1] == f"  resumed from {step_dir} at step 3 (resume_optimizer=strict)"
    assert resumed["resumed_checkpoint"] == str(step_dir)
    terminal = (runs / "first.terminal").read_text()
    assert "6/6 [" in terminal and "step/s, loss=" in terminal, terminal[-2000:]  # the bar drew, to the end
    assert "resource_tracker" not in terminal and "leaked" not in terminal, terminal[-2000:]


def test_val_loss_reaches_metrics_wandb_and_the_report(runs):
    logged = {r["step"]: r["val/loss"] for r in metrics(runs / "first") if "val/loss" in r}
    assert sorted(logged) == [2, 5] and summary(runs / "first")["final_val_loss"] == logged[5]
    history = [h["item"] for h in of_type(wandb_records(runs / "first"), "history")]
    assert {h["step"]: h["val/loss"] for h in history if "val/loss" in h} == logged
    (run,), _ = find_runs(runs / "first")
    column = [c.title for c in COLUMNS].index("val loss")
    assert table_rows([run])[0][column].text == format(logged[5], ".6g")


def test_compile_with_prefetch_trains_the_same_parameters(tmp_path):
    """``compile=true`` (inductor) under DDP with prefetch's per-module waits (kept out of the
    traced graph): the parameters equal the eager run's, bit for bit."""
    common = ("experiment=prefetch", "steps=4", "logger=none")
    eager, compiled = train_together(
        (*common, f"hydra.run.dir={tmp_path / 'eager'}"),
        (*common, "compile=true", f"hydra.run.dir={tmp_path / 'compiled'}"),
    )
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stderr[-3000:]
    plain, fast = summary(tmp_path / "eager"), summary(tmp_path / "compiled")
    assert fast["param_checksum"] == plain["param_checksum"] and fast["losses"] == plain["losses"]
    assert fast["compile"] is True and fast["compiled_graphs"] >= 1
