"""``resume=`` of a DCP checkpoint, checked before any rank starts: one line, nothing loaded.

A ``step_N.dcp`` directory the job will resume (``resume=`` names it, or a run dir whose newest
checkpoint it is) is checked from its files and ``.metadata`` alone by :mod:`zero_lab.dcp_check`
(its integrity record, the metadata unpickled with DCP's classes only, every ``.distcp`` file there
and long enough, ``zero_lab.json`` readable) and against the plan's meta model (every tensor's
shape and dtype, no model key the model lacks; with the optimizer loaded, no state of a parameter
the model lacks). A problem ends the job with one ``zero_lab: resume: checkpoint ...: <file>:
<cause>`` line (exit code 2) before Hydra creates the run dir; a checkpoint without an integrity
record (torch's ``dcp.save`` alone) loads after a one-line note that it is unverified.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from zero_lab.app.check.before_start import fail
from zero_lab.app.config.schema import enum_str
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.run.checkpoints import find_any, is_dcp, read_dcp_extra
from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_check import check_files, check_fits, check_state_names
from zero_lab.dcp_record import RECORD
from zero_lab.runtime import external

__all__ = ["refuse_bad_dcp_resume"]


def refuse_bad_dcp_resume(cfg: DictConfig, plan: RunPlan) -> None:
    """Check the DCP checkpoint ``cfg.resume`` resumes, if any: a problem ends the job (one line,
    exit code 2, :func:`~zero_lab.app.check.before_start.fail`); a note is printed once per world."""
    if cfg.get("resume") is None:
        return
    found = find_any(Path(str(cfg.resume)).expanduser())
    if found is None or not is_dcp(found):
        return  # no checkpoint is the config check's problem; the native format is checked as it loads
    try:
        metadata, verified = check_files(found)
        read_dcp_extra(found)
        model = plan.model.value
        if model is not None:  # no model: the config check reported it
            check_fits(found, metadata, {"model": model.state_dict()}, strict=("model",))
            if enum_str(cfg.get("resume_optimizer", "strict")) != "reset":
                check_state_names(found, metadata, "optim.state", [name for name, _ in model.named_parameters()])
    except CheckpointError as error:
        fail(f"resume: {error}")  # the error names the checkpoint, the file and the cause
    if not verified and external.rank() == 0:
        print(
            f"zero_lab: note: checkpoint {found} has no integrity record ({RECORD}): it was written by another "
            "tool or an older zero_lab, or copied without it; its files are loaded unverified",
            file=sys.stderr,
            flush=True,
        )
