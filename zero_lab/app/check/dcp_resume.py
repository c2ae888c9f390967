"""``resume=`` of a DCP checkpoint, checked before any rank starts: one line, nothing loaded.

A ``step_N.dcp`` directory the job will resume (``resume=`` names it, or a run dir whose newest
checkpoint it is) is checked in the process that checks the config, from its files and
``.metadata`` alone (:mod:`zero_lab.dcp_check`), against the job's meta model (the plan's):

* its integrity record: every file's size and sha256 (a byte flipped mid-file is named);
* ``.metadata``: there, readable, unpickled with DCP's metadata classes only (a tampered one is
  refused by the global it names, and nothing of it runs);
* every ``.distcp`` file the metadata names: there and long enough;
* every model tensor: in the checkpoint with this model's shape and dtype (``model.hidden=48``
  after saving 64 names the parameter and both shapes), and no model key the model lacks; with
  the optimizer loaded, no optimizer state of a parameter the model lacks;
* ``zero_lab.json``: readable.

A problem ends the job with one ``zero_lab: resume: checkpoint ...: <file>: <cause>`` line
(exit code 2) before Hydra creates the run dir. A checkpoint without an integrity record
(written by torch's ``dcp.save`` alone, or by zero_lab before it wrote one) loads after a
one-line note that it is unverified.

    notes = check_dcp_resume(cfg, plan)      # raises CheckpointError
    refuse_bad_dcp_resume(cfg, plan)         # the same, as the job's check: fail() or print the notes
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from zero_lab.app.check.before_start import fail
from zero_lab.app.config.schema import enum_str
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.run import dcp_checkpoints
from zero_lab.app.run.checkpoints import find_any
from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_check import check_files, check_fits, check_state_names
from zero_lab.dcp_record import RECORD
from zero_lab.runtime import external

__all__ = ["check_dcp_resume", "refuse_bad_dcp_resume"]


def check_dcp_resume(cfg: DictConfig, plan: RunPlan) -> list[str]:
    """Check the DCP checkpoint ``cfg.resume`` resumes (none: nothing to do); return the notes to
    print (an unverified checkpoint). Raises :class:`~zero_lab.checkpoint.CheckpointError`."""
    if cfg.get("resume") is None:
        return []
    path = Path(str(cfg.resume)).expanduser()
    found = find_any(path) if path.exists() else None
    if found is None or not dcp_checkpoints.is_dcp(found):
        return []  # no checkpoint is the config check's problem; the native format is checked as it loads
    metadata, verified = check_files(found)
    dcp_checkpoints.read_extra(found)
    model = plan.model.value
    if model is not None:  # no model: the config check reported it
        check_fits(found, metadata, {"model": model.state_dict()}, strict=("model",))
        if enum_str(cfg.get("resume_optimizer", "strict")) != "reset":
            check_state_names(found, metadata, "optim.state", [name for name, _ in model.named_parameters()])
    if verified:
        return []
    return [
        f"checkpoint {found} has no integrity record ({RECORD}): it was written by another tool or an older "
        "zero_lab, or copied without it; its files are loaded unverified"
    ]


def refuse_bad_dcp_resume(cfg: DictConfig, plan: RunPlan) -> None:
    """:func:`check_dcp_resume` as a job's check does it: a problem ends the job (one line, exit
    code 2, :func:`~zero_lab.app.check.before_start.fail`); a note is printed once per world."""
    try:
        notes = check_dcp_resume(cfg, plan)
    except CheckpointError as error:
        fail(f"resume: {error}")  # the error names the checkpoint, the file and the cause
    for text in notes if external.rank() == 0 else []:
        print(f"zero_lab: note: {text}", file=sys.stderr, flush=True)
