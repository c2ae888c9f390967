"""Checkpoint files without processes: strict JSON, one checkpoint finder for both layouts,
pruning, checked loads with messages that name the file, saved-range coverage, run-dir claims
and a copy-pasteable resume hint (issue 15, items 1, 5, 6, 9; issue 13/14 keep_checkpoints)."""

from __future__ import annotations

import json
import pathlib
import shlex

import pytest
import torch

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.app.launch.run_dir import claim, set_aside_earlier_run
from zero_lab.app.record.closing import describe_failure, resume_hint
from zero_lab.checkpoint import (
    CheckpointError,
    checkpoints,
    digest_path,
    find_checkpoint,
    latest_checkpoint,
    load_checked_file,
    load_checkpoint,
    load_file,
    prune_checkpoints,
    save_checkpoint,
    save_file,
)
from zero_lab.files import write_json
from zero_lab.runtime.spawn import RankFailure


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"bare {constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_write_json_writes_non_finite_floats_as_null_and_leaves_no_temp_file(tmp_path):
    path = write_json(tmp_path / "summary.json", {"final_loss": float("nan"), "losses": [1.0, float("inf")], "n": 2})
    assert strict_json(path.read_text()) == {"final_loss": None, "losses": [1.0, None], "n": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def make_layouts(root: pathlib.Path) -> None:
    """Both app layouts, an incomplete directory, a partial and a stray file."""
    (root / "step_00000002").mkdir(parents=True)
    (root / "step_00000002" / "manifest.json").write_text("{}")
    (root / "step_00000003.pt").write_bytes(b"x")
    (root / "step_00000004").mkdir()  # no manifest: a crash mid-save
    (root / ".step_00000005.partial-abc").mkdir()
    (root / "notes.txt").write_text("hi")


def test_one_finder_sees_both_layouts_and_only_complete_checkpoints(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    make_layouts(root)
    assert [p.name for p in checkpoints(root)] == ["step_00000002", "step_00000003.pt"]
    assert latest_checkpoint(root) == root / "step_00000003.pt"
    assert find_checkpoint(tmp_path / "run") == root / "step_00000003.pt"  # a run dir
    assert find_checkpoint(root / "step_00000002") == root / "step_00000002"  # a checkpoint itself


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    make_layouts(tmp_path)
    (tmp_path / "step_00000001.pt").write_bytes(b"x")
    assert [p.name for p in prune_checkpoints(tmp_path, keep=2)] == ["step_00000001.pt"]
    assert [p.name for p in checkpoints(tmp_path)] == ["step_00000002", "step_00000003.pt"]
    assert not list(tmp_path.glob(".*pruned*"))
    assert prune_checkpoints(tmp_path, keep=0) == []  # 0: keep all


def test_a_single_file_checkpoint_is_checked_against_its_digest(tmp_path):
    path = tmp_path / "step_00000001.pt"
    save_file({"w": torch.arange(100.0)}, path)
    assert torch.equal(load_checked_file(path)["w"], torch.arange(100.0))
    data = bytearray(path.read_bytes())
    data[-200] ^= 0x01  # one flipped bit that torch.load alone would not notice
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"is corrupt: .* step_00000001\.pt\.sha256\.json says"):
        load_checked_file(path)
    digest_path(path).unlink()
    with pytest.raises(CheckpointError, match=r"record step_00000001\.pt\.sha256\.json is missing"):
        load_checked_file(path)


def test_a_refused_pickle_global_is_named_with_the_file(tmp_path):
    path = tmp_path / "step_00000001.pt"
    torch.save({"model": {}, "evil": pathlib.PurePosixPath("/etc")}, path)
    with pytest.raises(CheckpointError) as error:
        load_file(path)
    message = str(error.value)
    assert str(path) in message and "pathlib.PurePosixPath" in message and "\n" not in message


def test_a_truncated_plain_checkpoint_gets_a_clear_message(tmp_path):
    path = tmp_path / "step_00000001.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
        load_file(path)
    assert str(path) in str(error.value)


@pytest.fixture
def saved_w1(single_rank_group, tmp_path):
    """A one-rank ZeRO-Adam checkpoint after one step, and a fresh model + optimizer to load it."""

    def fresh():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        return model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)

    model, opt = fresh()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    directory = save_checkpoint(tmp_path / "step_00000001", opt, model)
    return directory, fresh


def edit_manifest(directory: pathlib.Path, edit) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    edit(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_the_manifest_names_the_optimizer_class_and_a_clean_checkpoint_loads(saved_w1):
    directory, fresh = saved_w1
    assert json.loads((directory / "manifest.json").read_text())["optimizer_class"] == "torch.optim.Adam"
    assert not list(directory.parent.glob(".step_00000001.*"))  # no partial or stale copy left
    model, opt = fresh()
    load_checkpoint(directory, opt, model)


def test_a_shard_removed_with_its_manifest_entry_is_refused(saved_w1):
    directory, fresh = saved_w1
    (directory / "optim-rank00000.pt").unlink()
    edit_manifest(directory, lambda m: m["files"].pop("optim-rank00000.pt"))
    with pytest.raises(CheckpointError, match=r"lists no optim-rank00000\.pt"):
        load_checkpoint(directory, *reversed(fresh()))


def test_saved_ranges_that_miss_part_of_a_parameter_are_refused(saved_w1):
    directory, fresh = saved_w1

    def cut(manifest):
        ranges = manifest["files"]["optim-rank00000.pt"]["ranges"]
        ranges[0][2] -= 1  # the first parameter's last element has no saved state

    edit_manifest(directory, cut)
    with pytest.raises(CheckpointError, match="covers elements"):
        load_checkpoint(directory, *reversed(fresh()))


def test_a_default_run_dir_taken_by_another_job_gives_a_fresh_one(tmp_path):
    wanted = tmp_path / "outputs" / "2026-11-23" / "10-00-00"
    first = claim(wanted, explicit=False)
    second = claim(wanted, explicit=False)
    assert (first, second) == (wanted, wanted.with_name("10-00-00-1"))
    assert (first / ".zero_lab.lock").read_text().strip().isdigit()


def test_an_explicit_run_dir_reused_later_sets_the_earlier_runs_files_aside(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    write_json(run_dir / "summary.json", {"steps": 1})
    (run_dir / "logs" / "rank1.error.txt").write_text("RuntimeError: from the earlier run\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step_00000001.pt").write_bytes(b"x")
    assert claim(run_dir, explicit=True) == run_dir
    earlier = run_dir / "earlier" / "1"
    assert sorted(p.name for p in earlier.iterdir()) == ["logs", "metrics.jsonl", "summary.json"]
    assert (earlier / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert not any((run_dir / name).exists() for name in ("metrics.jsonl", "summary.json", "logs"))
    assert (run_dir / "checkpoints" / "step_00000001.pt").exists()  # kept: resume=<this dir> reads it
    (run_dir / "summary.json").write_text("{}")
    assert set_aside_earlier_run(run_dir) == run_dir / "earlier" / "2"  # a third run: the next free folder
    assert set_aside_earlier_run(run_dir) is None


def test_the_resume_hint_is_shell_quoted(tmp_path):
    run_dir = tmp_path / "my runs" / "a b"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000002.pt").write_bytes(b"x")
    meta = {"overrides": ["optim=adam", "partitioner.params_per_rank=[[a*],[b*]]", "hydra.run.dir=x"]}
    hint = resume_hint(run_dir, meta)
    head, command = hint.split(" with: ")
    assert head == f"continue from step 2 ({run_dir / 'checkpoints' / 'step_00000002.pt'})"
    assert shlex.split(command) == [
        "python",
        "train.py",
        "optim=adam",
        "partitioner.params_per_rank=[[a*],[b*]]",
        f"resume='{run_dir}'",  # quoted for Hydra too: the path has spaces
    ]


def test_the_resume_hint_without_a_checkpoint_says_so_and_gives_the_jobs_own_command(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / ".step_00000002.dcp.partial-1a2b3c4d").mkdir(parents=True)  # cut short: not one
    meta = {"overrides": ["optim=adam", "resume=/runs/earlier", "hydra.run.dir=x y"]}
    assert resume_hint(run_dir, meta) == (
        f"no complete checkpoint in {run_dir}/checkpoints to resume from; "
        "start again with: python train.py optim=adam resume=/runs/earlier 'hydra.run.dir=x y'"
    )


def test_a_failure_every_rank_shares_is_not_called_an_echo(tmp_path):
    refused = "Traceback (most recent call last):\n  ...\nCheckpointError: /x/step_00000003 is corrupt: model.pt"
    reset = "Traceback (most recent call last):\n  ...\nRuntimeError: Read error: Connection reset by peer"
    message = describe_failure(RankFailure(0, refused, {1: refused, 2: reset}), tmp_path)
    assert message.splitlines() == [
        "rank 0 failed: CheckpointError: /x/step_00000003 is corrupt: model.pt",
        f"  its log: {tmp_path}/logs/rank0.log",
        f"  full traceback: {tmp_path}/logs/rank0.error.txt",
        "  (rank 1 failed too, with the same error)",
        "  (rank 2 failed after it: RuntimeError: Read error: Connection reset by peer)",
    ]
    assert (tmp_path / "logs" / "rank0.error.txt").read_text() == refused


@pytest.mark.parametrize("name", ["a,b", "it's here", "x=[1,2]", "plain-name"])
def test_the_resume_hint_parses_back_to_the_run_dir_for_hydra(tmp_path, name):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    run_dir = tmp_path / name
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000002.pt").write_bytes(b"x")
    words = shlex.split(resume_hint(run_dir, {"overrides": []}).split(" with: ")[1])
    (override,) = OverridesParser.create().parse_overrides([words[-1]])
    assert (override.key_or_group, override.value()) == ("resume", str(run_dir))


def test_a_reused_run_dir_keeps_the_users_own_files_in_logs(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "mine.txt").write_text("the user's")
    (tmp_path / "logs" / "rank0.log").write_text("an earlier run's")
    assert claim(tmp_path, explicit=True) == tmp_path
    assert (tmp_path / "logs" / "mine.txt").read_text() == "the user's"
    assert (tmp_path / "earlier" / "1" / "logs" / "rank0.log").read_text() == "an earlier run's"
    assert not (tmp_path / "logs" / "rank0.log").exists()


def test_a_writer_whose_swap_is_beaten_twice_still_publishes_its_own_copy(tmp_path, monkeypatch):
    """Two other writers publish the same step between this writer's moving the old copy aside
    and its own rename, twice: each of its tries moves aside to a name of its own (the second
    once collided with the first's copy and failed with ENOTEMPTY), its copy ends up published
    and none of the copies it moved aside is left behind."""
    import os

    from zero_lab import checkpoint

    final, partial = tmp_path / "step_00000001", tmp_path / ".step_00000001.partial"
    for folder, text in ((final, "old"), (partial, "mine")):
        folder.mkdir()
        (folder / "payload").write_text(text)
    beaten = []
    real_replace = os.replace

    def replace_after_another_writer(src, dst):
        if pathlib.Path(src) == partial and len(beaten) < 2:  # someone else publishes first
            beaten.append(dst)
            pathlib.Path(dst).mkdir()
            (pathlib.Path(dst) / "payload").write_text(f"theirs {len(beaten)}")
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace_after_another_writer)
    checkpoint._swap_into_place(partial, final, "t0ken")
    assert len(beaten) == 2
    assert (final / "payload").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]
