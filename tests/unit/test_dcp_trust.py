"""A DCP checkpoint runs no code, is verified like the native format, and every failure is one
line naming the checkpoint, the file and the cause (issue 37, items 1-3).

One process, no process group: ``torch.distributed.checkpoint`` saves and loads as a single
process then. Each test saves a small model + AdamW state with :func:`zero_lab.dcp.save` (or
torch's own ``dcp.save``, for a checkpoint without an integrity record), changes one thing, and
reads it back with :func:`zero_lab.dcp.check` (before loading) and :func:`zero_lab.dcp.load`.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from zero_lab import dcp as zero_dcp
from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_record import RECORD, write_record

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _model(hidden: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, 2))


def _state(model: nn.Module, seed: int) -> dict[str, Any]:
    """``{"model", "optim"}`` as torch's state-dict functions give them, after one AdamW step."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    torch.manual_seed(seed)
    for param in model.parameters():
        nn.init.normal_(param)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A checkpoint written by ``zero_lab.dcp.save`` (with its record), and what it holds."""
    state = _state(_model(), seed=0)
    return zero_dcp.save(state, tmp_path / "ckpt"), state


def _template() -> dict[str, Any]:
    return _state(_model(), seed=1)  # other values, the same keys and shapes


def _refused(call: Any) -> str:
    """The one-line message of the CheckpointError ``call()`` raises."""
    with pytest.raises(CheckpointError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    return message


class _Touch:
    """Unpickling this runs ``touch <marker>``, the shell command a tampered pickle would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


# ---------------------------------------------------------------- 1. nothing is unpickled but data
def test_a_tampered_metadata_is_refused_by_name_and_runs_nothing(saved, tmp_path):
    path, _ = saved
    marker, proof = tmp_path / "ran", tmp_path / "ran-with-plain-pickle"
    (path / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))
    write_record(path)  # whoever replaced it can rewrite the record too
    for call in (lambda: zero_dcp.check(path), lambda: zero_dcp.load(_template(), path)):
        message = _refused(call)
        assert f"checkpoint {path}: .metadata: refused the global {os.system.__module__}.system" in message
    assert not marker.exists()
    pickle.loads(pickle.dumps(_Touch(proof)))  # the same payload, unpickled as torch's reader does: it runs
    assert proof.exists()


def test_a_tampered_value_in_a_distcp_file_is_refused_by_name_and_runs_nothing(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker, proof = tmp_path / "ran", tmp_path / "ran-with-torch-reader"
    for target, where in ((marker, "ours"), (proof, "torch's")):
        dcp.save({"note": _Touch(target), "w": torch.ones(2)}, checkpoint_id=str(tmp_path / where))
    message = _refused(lambda: zero_dcp.load({"note": None, "w": torch.zeros(2)}, tmp_path / "ours"))
    assert f"checkpoint {tmp_path / 'ours'}: __0_0.distcp (note): refused to load the global" in message
    assert "system" in message
    assert not marker.exists()
    dcp.load({"note": None, "w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "torch's"))  # torch's own reader
    assert proof.exists()


def test_a_blocked_module_s_global_is_named_in_a_native_file_too(tmp_path):
    from zero_lab.checkpoint import load_file

    torch.save({"evil": _Touch(tmp_path / "ran")}, tmp_path / "model.pt")
    message = _refused(lambda: load_file(tmp_path / "model.pt"))
    assert f"{tmp_path / 'model.pt'}: refused to load the global {os.system.__module__}.system" in message
    assert not (tmp_path / "ran").exists()


def test_a_checkpoint_round_trips_through_the_checked_reader(saved):
    path, state = saved
    template = _template()
    assert zero_dcp.check(path, template) is True
    assert zero_dcp.load(template, path) is True  # verified against its record
    for key, value in state["model"].items():
        assert torch.equal(template["model"][key], value)
    for fqn, entry in state["optim"]["state"].items():
        assert all(torch.equal(template["optim"]["state"][fqn][k], v) for k, v in entry.items())
    assert template["optim"]["param_groups"] == state["optim"]["param_groups"]


# ---------------------------------------------------------------- 2. the integrity record
def test_the_record_lists_every_file_with_its_size_and_sha256(saved):
    import hashlib
    import json

    path, _ = saved
    record = json.loads((path / RECORD).read_text())
    names = sorted(p.name for p in path.iterdir() if p.name != RECORD)
    assert sorted(record["files"]) == names == [".metadata", "__0_0.distcp"]
    for name in names:
        data = (path / name).read_bytes()
        assert record["files"][name] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_one_byte_flipped_mid_file_is_refused_naming_the_file(saved):
    path, _ = saved
    payload = path / "__0_0.distcp"
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    for call in (lambda: zero_dcp.check(path), lambda: zero_dcp.load(_template(), path)):
        message = _refused(call)
        assert f"checkpoint {path} is corrupt: __0_0.distcp has {len(data)} bytes (sha256" in message


def test_a_checkpoint_without_a_record_loads_unverified_with_a_warning(tmp_path, caplog):
    import torch.distributed.checkpoint as dcp

    state = _state(_model(), seed=0)
    dcp.save(state, checkpoint_id=str(tmp_path / "theirs"))  # another tool: no record
    template = _template()
    assert zero_dcp.check(tmp_path / "theirs", template) is False
    with caplog.at_level(logging.WARNING, logger="zero_lab.dcp"):
        assert zero_dcp.load(template, tmp_path / "theirs") is False
    assert [r.getMessage() for r in caplog.records if r.name == "zero_lab.dcp"] == [
        f"checkpoint {tmp_path / 'theirs'} has no integrity record ({RECORD}): its files are loaded unverified"
    ]
    assert torch.equal(template["model"]["0.weight"], state["model"]["0.weight"])


# ---------------------------------------------------------------- 3. one line per failure
def _truncate(path: Path, name: str) -> None:
    os.truncate(path / name, (path / name).stat().st_size // 2)


def _no_record(path: Path) -> None:
    (path / RECORD).unlink()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: _truncate(p, "__0_0.distcp"), "{p}: __0_0.distcp is truncated: it has"),
        (lambda p: (_no_record(p), _truncate(p, "__0_0.distcp")), "{p}: __0_0.distcp is truncated: it has"),
        (lambda p: (p / "__0_0.distcp").unlink(), "{p}: __0_0.distcp is missing"),
        (lambda p: (_no_record(p), (p / "__0_0.distcp").unlink()), "{p}: __0_0.distcp is missing"),
        (lambda p: (_no_record(p), (p / ".metadata").unlink()), "{p}: .metadata is missing"),
        (lambda p: (_no_record(p), (p / ".metadata").write_bytes(b"\x80\x04not a pickle")),
         "{p}: .metadata: cannot read it, the file is truncated or corrupt"),
        (lambda p: (p / RECORD).write_text("{}"), f"{{p}}: {RECORD} is not a zero_lab.dcp-record/1 record"),
    ],
    ids=["truncated", "truncated-no-record", "missing-distcp", "missing-distcp-no-record", "missing-metadata",
         "unreadable-metadata", "broken-record"],
)  # fmt: skip
def test_each_broken_file_is_one_line_naming_checkpoint_file_and_cause(saved, damage, expected):
    path, _ = saved
    damage(path)
    for call in (lambda: zero_dcp.check(path), lambda: zero_dcp.load(_template(), path)):
        assert f"checkpoint {expected.format(p=path)}" in _refused(call)


def test_another_shape_is_named_with_both_shapes_before_and_while_loading(saved):
    path, _ = saved
    template = _state(_model(hidden=5), seed=1)
    expected = f"checkpoint {path}: .metadata: model.0.weight has shape (3, 4) in the checkpoint, (5, 4) in this model"
    assert expected in _refused(lambda: zero_dcp.check(path, template))
    assert expected in _refused(lambda: zero_dcp.load(template, path))  # torch's own refusal, in the same words


def test_another_dtype_and_keys_the_model_lacks_or_has_are_named(saved):
    path, _ = saved
    wider = {"model": _model().double().state_dict()}
    assert "model.0.weight is torch.float32 in the checkpoint, torch.float64 in this model" in _refused(
        lambda: zero_dcp.check(path, wider)
    )
    smaller = {"model": nn.Sequential(nn.Linear(4, 3)).state_dict()}
    assert f"checkpoint {path}: .metadata: holds model.1.bias (and 1 more), which this model does not have" in (
        _refused(lambda: zero_dcp.check(path, smaller))
    )
    larger = {"model": nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2)).state_dict()}
    for call in (lambda: zero_dcp.check(path, larger), lambda: zero_dcp.load(larger, path)):
        assert f"checkpoint {path}: .metadata: has no model.2.weight" in _refused(call)


def test_optimizer_state_of_a_parameter_the_model_lacks_is_named(saved):
    from zero_lab.dcp_check import check_files, check_state_names

    path, _ = saved
    metadata, _ = check_files(path)
    check_state_names(path, metadata, "optim.state", ["0.weight", "0.bias", "1.weight", "1.bias"])
    message = _refused(lambda: check_state_names(path, metadata, "optim.state", ["0.weight", "0.bias"]))
    assert f"checkpoint {path}: .metadata: holds optimizer state optim.state.1.bias.exp_avg of a parameter" in message


def test_a_file_the_metadata_places_outside_the_checkpoint_is_refused(saved, tmp_path):
    from zero_lab.dcp_reader import read_metadata_file

    path, _ = saved
    metadata = read_metadata_file(path / ".metadata")
    outside = tmp_path / "outside.distcp"
    shutil.copy(path / "__0_0.distcp", outside)
    for info in metadata.storage_data.values():
        info.relative_path = "../outside.distcp"
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    (path / RECORD).unlink()
    message = _refused(lambda: zero_dcp.check(path))
    assert f"checkpoint {path}: .metadata names the file '../outside.distcp'" in message
    assert "names the file '../outside.distcp'" in _refused(lambda: zero_dcp.load(_template(), path))


def test_the_job_check_imports_no_dcp_until_it_reads_a_checkpoint():
    """Every job's config check imports these modules; torch.distributed.checkpoint (1-3 s to
    import) loads only when a DCP checkpoint is read."""
    code = (
        "import sys, zero_lab.dcp, zero_lab.dcp_check, zero_lab.app.check.callback\n"
        "print('torch.distributed.checkpoint' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
