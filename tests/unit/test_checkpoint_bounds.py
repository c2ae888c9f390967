"""Every read of a checkpoint file is bounded (issue 20): a FIFO, a directory or a device in
a file's place is refused before it is opened, a file's size is checked before a byte is
hashed, a manifest that is not UTF-8 JSON with every key is a ``CheckpointError`` naming
it, and a checkpoint of another model names the parameter that differs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.checkpoint import (
    CheckpointError,
    find_checkpoint,
    load_checked_file,
    load_checkpoint,
    save_checkpoint,
    save_file,
)

pytestmark = pytest.mark.timeout(60)  # before the fix, a FIFO in a file's place hung the load forever


def _model(hidden: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 2))


@pytest.fixture
def saved(tmp_path, single_rank_group) -> Path:
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return save_checkpoint(tmp_path / "step_00000001", opt, model)


def _load(directory: Path, hidden: int = 3) -> None:
    model = _model(hidden)
    load_checkpoint(directory, ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2), model)


@pytest.mark.parametrize(
    ("kind", "what"), [("fifo", "a FIFO"), ("dir", "a directory"), ("device", "a character device")]
)
def test_a_special_file_in_place_of_model_pt_is_refused_unread(saved, kind, what):
    path = saved / "model.pt"
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # endless: hashing it would never finish
    with pytest.raises(CheckpointError, match=f"model.pt: is {what}, not a regular file"):
        _load(saved)


def test_a_size_mismatch_is_found_before_hashing(saved):
    with open(saved / "model.pt", "ab") as handle:
        handle.write(b"x" * 10)
    with pytest.raises(CheckpointError, match=r"is corrupt: model.pt has \d+ bytes, the manifest says \d+ bytes$"):
        _load(saved)


def test_a_fifo_as_a_plain_checkpoint_or_its_record_is_refused(tmp_path):
    path = save_file({"x": torch.ones(2)}, tmp_path / "step_00000001.pt")
    record = path.with_name(path.name + ".sha256.json")
    record.unlink()
    os.mkfifo(record)
    with pytest.raises(CheckpointError, match=r"sha256\.json: is a FIFO"):
        load_checked_file(path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe not utf-8", r"manifest.json: the manifest is not valid UTF-8 JSON \(UnicodeDecodeError"),
        (b"{not json", r"manifest.json: the manifest is not valid UTF-8 JSON \(JSONDecodeError"),
        (b"[1, 2]", r"manifest.json: the manifest is not a JSON object"),
    ],
)
def test_a_manifest_that_is_not_utf8_json_is_named(saved, content, expected):
    (saved / "manifest.json").write_bytes(content)
    with pytest.raises(CheckpointError, match=expected):
        _load(saved)


def test_a_manifest_missing_a_key_is_named(saved):
    manifest = json.loads((saved / "manifest.json").read_text())
    del manifest["extra"]
    (saved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"manifest.json: the manifest lacks extra"):
        _load(saved)


def test_a_checkpoint_of_another_model_names_the_parameter(saved):
    with pytest.raises(CheckpointError, match=r"parameter '0.weight' \(#0\) has shape \(3, 4\) in group 0 in the "
                       r"checkpoint, shape \(5, 4\) in group 0 here"):  # fmt: skip
        _load(saved, hidden=5)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root only; skipped elsewhere, saying so)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_during_a_save_says_so_and_leaves_no_checkpoint(tiny_disk, single_rank_group):
    model = torch.nn.Linear(512, 1024)  # 2 MiB of weights: model.pt alone overflows 1 MiB
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    target = tiny_disk / "checkpoints" / "step_00000001"
    with pytest.raises(CheckpointError, match=r"^no space left on device: writing .*model\.pt needs at least "
                       r"2101248 bytes, \d+ bytes are free on its filesystem"):  # fmt: skip
        save_checkpoint(target, opt, model)
    assert find_checkpoint(tiny_disk) is None and find_checkpoint(tiny_disk / "checkpoints") is None
    assert not any(p.name.startswith(".model.pt.tmp") for p in tiny_disk.rglob("*"))  # no temporary file left


def test_a_full_disk_during_a_plain_save_leaves_no_file_a_resume_accepts(tiny_disk):
    path = tiny_disk / "step_00000001.pt"
    with pytest.raises(CheckpointError, match=r"^no space left on device: writing .*step_00000001\.pt needs"):
        save_file({"w": torch.zeros(512, 1024)}, path)
    assert find_checkpoint(tiny_disk) is None
