"""Issue 30, items 2, 4 and 5 (the config side): what is refused before any rank starts, by the
check ``python train.py`` runs (no processes; a one-rank in-process group to write checkpoints):
scheduler arguments by torch's own class, the scheduler a strict resume loads into, the text
corpus (present, non-empty, read only up to ``max_bytes``, its vocabulary within the model's
embedding), the Muon globs that cannot route, and run dirs that cannot be claimed."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.preflight import compose_job, preflight, problems
from zero_lab.app.check.notices import notices
from zero_lab.app.launch.run_dir import ClaimRunDir, claim, system_dir
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.run import checkpoints as run_checkpoints
from zero_lab.app.run.build import build_training
from zero_lab.app.workloads.data import TextData

SMALL = ["model.hidden=16", "model.in_dim=8", "model.out_dim=8", "model.depth=2"]


# ---------------------------------------------------------------- the scheduler
def test_scheduler_arguments_are_checked_by_its_own_class_before_start():
    message = problems("scheduler=step", "scheduler.step_size=0")
    assert "scheduler.step_size=0: StepLR refuses it: integer modulo by zero (at step 1: ZeroDivisionError)" in message
    assert "scheduler.last_epoch" not in message  # read by the failing line too, but left at its default
    message = problems("scheduler=linear", "scheduler.start_factor=0")
    expected = "scheduler.start_factor=0.0: LinearLR refuses it: Starting multiplicative factor expected to be greater"
    assert expected in message
    preflight(["scheduler=step", "scheduler.step_size=3", "scheduler.warmup_steps=2"])


@pytest.fixture
def saved_with_cosine(tmp_path, single_rank_group, request):
    """A run dir holding a step-1 checkpoint of ``optim=<param>`` with ``scheduler=cosine``."""
    optim = request.param
    cfg, _, _ = compose_job([f"optim={optim}", "scheduler=cosine", "logger=none", *SMALL])
    training = build_training(cfg, torch.device("cpu"))
    run_checkpoints.save(training, tmp_path / "run", next_step=1, losses=[1.0])
    return tmp_path / "run", optim


@pytest.mark.parametrize("saved_with_cosine", ["adam", "zero_adam"], indirect=True)
def test_a_strict_resume_into_another_scheduler_is_refused(saved_with_cosine):
    run_dir, optim = saved_with_cosine
    common = [f"optim={optim}", "logger=none", f"resume={run_dir}", *SMALL]
    message = problems(*common, "scheduler=step")
    assert (
        f"scheduler=step: resume={run_dir} holds the LR schedule of scheduler=cosine, and resume_optimizer=strict "
        "loads it into this run's; pick the scheduler" in message
    )
    assert f"resume={run_dir} holds the LR schedule of scheduler=cosine" in problems(
        *common, "scheduler=cosine", "scheduler.warmup_steps=2"
    )
    assert f"resume={run_dir} holds the LR schedule of scheduler=cosine" in problems(*common, "scheduler=none")
    preflight([*common, "scheduler=cosine"])  # the same scheduler resumes
    preflight([*common, "scheduler=step", "resume_optimizer=reset"])  # a fresh schedule is asked for


# ---------------------------------------------------------------- text data
def test_an_empty_or_missing_corpus_is_refused_before_start(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.py").write_bytes(b"")
    common = ["model=transformer", "data=text", "model.vocab_size=256"]
    for path, words in (
        (tmp_path / "empty.txt", "is empty"),
        (tmp_path / "folder", "holds only empty files matching data.pattern=**/*.py"),
        (tmp_path / "missing", "no such file or folder"),
    ):
        message = problems(*common, f"data.path={path}")
        assert f"data=text: cannot be built: TextData: data.path={path}: {words}" in message, message


def test_the_corpus_is_read_only_up_to_max_bytes(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (16 * 2**20))  # 16 MiB on disk; a whole read would allocate all of it
    tracemalloc.start()
    try:
        data = TextData(global_batch=2, seq_len=8, seed=0, path=str(big), max_bytes=4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data.train_tokens) + len(data.val_tokens) == 4096
    assert peak < 2**20, peak  # streamed: what max_bytes asks for, not the file


def test_transformer_on_text_follows_the_datas_vocabulary_and_a_given_one_is_checked():
    cfg, _ = preflight(["model=transformer", "data=text", "data.max_bytes=65536"])
    assert (cfg.model.vocab_size, cfg.model.seq_len) == (256, cfg.data.seq_len)  # bytes; the data's windows
    message = problems("model=transformer", "data=text", "model.vocab_size=64", "data.max_bytes=65536")
    assert (
        "model.vocab_size=64 with data=text (vocabulary 256): the data's token ids go up to 255, but the model's "
        "embedding has 64 rows; set model.vocab_size=256" in message
    )


# ---------------------------------------------------------------- Muon routing
def test_a_to_muon_glob_on_1d_parameters_is_a_notice():
    overrides = ["optim=zero_muon", "model=transformer", "data=tokens", "+optim.param_groups.to_muon=[*.bias]"]
    cfg, _ = preflight(overrides)
    (line,) = notices(cfg, overrides, RunPlan.of(cfg))
    assert line.startswith(
        "optim.param_groups.to_muon: '*.bias' matches 13 parameter(s) that are not 2-D (blocks.0.ln1.bias, "
        "blocks.0.qkv.bias, blocks.0.proj.bias, blocks.0.ln2.bias and 9 more); Muon steps only matrices, so 1-D"
    )
    plain = ["optim=zero_muon", "model=transformer", "data=tokens", "+optim.param_groups.to_muon=[*.qkv.weight]"]
    cfg, _ = preflight(plain)
    assert notices(cfg, plain, RunPlan.of(cfg)) == []


# ---------------------------------------------------------------- the run dir
@pytest.mark.parametrize(
    ("path", "found"), [("/", "/"), ("/etc/zero_lab", "/etc"), ("/usr/lib/x", "/usr"), ("/proc/self", "/proc")]
)
def test_system_dirs_are_never_run_dirs(path, found):
    assert system_dir(path) == found
    with pytest.raises(RuntimeError, match=f"run dir {path} (is|lies in {found},) a system directory"):
        claim(path, explicit=False)


def test_a_user_dir_is_no_system_dir(tmp_path):
    assert system_dir(tmp_path / "run") is None
    assert system_dir("outputs/x") is None


def _config(run_dir: str):
    return OmegaConf.create({"hydra": {"run": {"dir": run_dir}, "overrides": {"hydra": []}}})


def test_any_failure_to_claim_stops_the_job_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for run_dir, words in (
        ("/", "zero_lab: run dir / is a system directory; a run writes .hydra/, train.log, logs/ and its metrics"),
        ("out\0put", "zero_lab: run dir out\0put cannot be claimed (ValueError: embedded null byte); the job does not"),
    ):
        with pytest.raises(SystemExit) as stopped:
            ClaimRunDir().on_run_start(_config(run_dir))
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(words) and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []
    assert not Path("/.zero_lab.lock").exists()
