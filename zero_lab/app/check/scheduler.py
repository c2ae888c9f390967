"""The LR scheduler checked before start by torch's own classes, on a one-tensor optimizer.

A scheduler's constructor checks its arguments only in part: ``StepLR(step_size=0)`` builds, and
fails at its first ``step()`` in every rank. So the run's scheduler is built as the ranks build it
(:func:`zero_lab.app.run.build.make_scheduler`, warmup included) on a dummy ``SGD`` over one
``meta`` tensor and stepped as many times as the run will (up to :data:`_STEPS_CHECKED`); a
refusal names the configured keys the error or the failing line of torch's code reads.

Under ``resume=`` with ``resume_optimizer=strict`` the checkpoint's scheduler state must have this
run's shape (the keys of the classes' ``state_dict``, chained ones included): resuming a cosine
run with ``scheduler=step`` would load ``T_max`` into a ``StepLR``.

    problems = scheduler_problems(cfg) + resumed_scheduler_problems(cfg, choices)
"""

from __future__ import annotations

import inspect
import json
import linecache
import re
import traceback
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.errors import HydraException
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.optim.lr_scheduler import LRScheduler

from zero_lab.app.check.options import options_where
from zero_lab.app.config.schema import APP_KEYS, HYDRA_KEYS, enum_str
from zero_lab.app.config.targets import refusal
from zero_lab.app.run.build import make_scheduler
from zero_lab.app.run.checkpoints import find_any, is_dcp, read_dcp_extra
from zero_lab.checkpoint import CheckpointError, load_plain, read_manifest

__all__ = ["resumed_scheduler_problems", "scheduler_problems"]

_STEPS_CHECKED = 10_000  # at most this many steps before start (about 0.2 s on a busy core)

#: What a scheduler class raises for arguments it refuses, built or stepped: range checks, an argument
#: it lacks, ``StepLR(step_size=0)``'s ZeroDivisionError, an index past what it holds, a tensor operation
#: refused; Hydra's InstantiationException around any of them.
_REFUSED = (ValueError, TypeError, ArithmeticError, LookupError, RuntimeError, HydraException)

#: What reading a checkpoint's scheduler state can raise: an unreadable file, a manifest or record that
#: is not ours, a torch file refused or cut short (:func:`~zero_lab.checkpoint.load_plain`).
_UNREADABLE = (OSError, CheckpointError, KeyError, ValueError)


def _built_scheduler(cfg: DictConfig) -> LRScheduler | None:
    """This run's scheduler on an SGD over one meta tensor at ``optim.lr``, as :func:`make_scheduler` builds
    it (``None``: ``scheduler=none``). ``cfg`` needs only ``scheduler`` (and what it interpolates)."""
    optim = cfg.get("optim")
    lr = optim.get("lr") if optim is not None else None
    param = torch.zeros(1, device="meta", requires_grad=True)  # a scheduler reads the groups' lr, never a tensor
    optimizer = torch.optim.SGD([param], lr=lr if isinstance(lr, float) else 1e-3)
    return make_scheduler(cfg, optimizer)


def scheduler_problems(cfg: DictConfig) -> list[str]:
    """Build the run's scheduler and step it ``min(steps, _STEPS_CHECKED)`` times; one line
    naming the keys to blame when torch's class refuses."""
    node = cfg.get("scheduler")
    if node is None or node.get("_target_") is None:
        return []
    step = 0
    try:
        scheduler = _built_scheduler(cfg)
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": nothing to step here
            warnings.simplefilter("ignore")
            while step < min(int(cfg.steps), _STEPS_CHECKED):
                step += 1
                scheduler.step()  # type: ignore[union-attr]
    except OmegaConfBaseException:  # an interpolation that does not resolve: the composition's to name
        return []
    except _REFUSED as error:  # the scheduler's class refuses its arguments: named with its keys
        when = f"at step {step}" if step else "when built"
        own = {k: v for k, v in node.items() if k not in HYDRA_KEYS and k not in APP_KEYS["scheduler"]}
        line = refusal("scheduler", node, error, blamed=_blamed(error, node, own))
        return [f"{line} ({when}: {type(error).__name__}); give scheduler.<key> values the class accepts"]
    return []


def _blamed(error: BaseException, node: Mapping[str, Any], keys: Mapping[str, Any]) -> list[str]:
    """The configured keys that the innermost failing line of code reads (``self.step_size``; for
    a ``raise``, the lines of its test above it), those set away from the class's default first
    (``last_epoch=-1`` is read by every step)."""
    frames = traceback.extract_tb(error.__traceback__)
    line = frames[-1].line or "" if frames else ""
    if line.startswith("raise") and frames[-1].lineno:  # `if <the test>:` above it reads the keys
        above = range(max(1, frames[-1].lineno - 3), frames[-1].lineno)
        line = " ".join(linecache.getline(frames[-1].filename, n) for n in above) + line
    read = [k for k in keys if line and re.search(rf"\b{re.escape(str(k))}\b", line)]
    try:
        defaults = inspect.signature(get_object(str(node.get("_target_")))).parameters
    except (ImportError, ValueError, TypeError):  # get_object's, inspect.signature's
        return read
    changed = [k for k in read if k not in defaults or defaults[k].default != keys[k]]
    return changed or read


def _state_shape(state: Any) -> Any:
    """A scheduler state's shape: its keys, and those of the schedulers it chains (``_schedulers``)."""
    if isinstance(state, Mapping):
        return {str(k): _state_shape(v) if k == "_schedulers" else None for k, v in state.items()}
    if isinstance(state, list):
        return [_state_shape(s) for s in state]
    return None


def resumed_scheduler_problems(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    """Under ``resume_optimizer=strict``, the checkpoint's scheduler state must be this run's kind."""
    if cfg.get("resume") is None or enum_str(cfg.get("resume_optimizer", "strict")) != "strict":
        return []
    found = find_any(Path(str(cfg.resume)).expanduser())
    if found is None:
        return []  # _check_resume's
    try:
        saved = _saved_scheduler(found)
    except _UNREADABLE:  # an unreadable checkpoint is named by the ranks' checked loaders
        return []
    mine = _built_scheduler(cfg)
    mine_shape = _state_shape(_json(mine.state_dict())) if mine is not None else None
    saved_shape = _state_shape(saved) if saved is not None else None
    if mine_shape == saved_shape:
        return []
    here = f"scheduler={choices.get('scheduler') or cfg.scheduler.get('_target_')}"
    warmup = cfg.scheduler.get("warmup_steps", 0) if cfg.get("scheduler") is not None else 0
    here += f" with scheduler.warmup_steps={warmup}" if warmup else ""
    return [
        f"{here}: resume={cfg.resume} holds the LR schedule of {_describe(saved, cfg)}, and "
        "resume_optimizer=strict loads it into this run's; pick the scheduler (and scheduler.warmup_steps) it "
        "was saved with, or resume_optimizer=reset to start the schedule and optimizer fresh"
    ]


def _json(state: Any) -> Any:
    return json.loads(json.dumps(state))


def _saved_scheduler(found: Path) -> Any:
    """The scheduler state a checkpoint holds (``None``: it has none), read without loading tensors."""
    if is_dcp(found):
        return read_dcp_extra(found).get("scheduler")
    if found.is_dir():
        return read_manifest(found)["extra"].get("scheduler")
    state = load_plain(found, str(found), mmap=True)
    return state.get("scheduler") if isinstance(state, dict) else None


def _describe(saved: Any, cfg: DictConfig) -> str:
    """``scheduler=cosine`` when a shipped option (with the saved warmup, if any) has the saved
    state's shape; else its keys; ``scheduler=none`` when it holds no schedule."""
    if saved is None:
        return "scheduler=none (no schedule)"
    chained = isinstance(saved, Mapping) and "_schedulers" in saved

    def fits(node: DictConfig) -> bool:
        option = {k: v for k, v in node.items_ex(resolve=False) if k not in ("defaults", "warmup_steps")}
        trial = OmegaConf.create({"steps": cfg.steps, "scheduler": {**option, "warmup_steps": 1 if chained else 0}})
        built = _built_scheduler(trial) if node.get("_target_") is not None else None
        return built is not None and _state_shape(_json(built.state_dict())) == _state_shape(saved)

    if fitting := options_where("scheduler", fits):
        return f"scheduler={fitting[0]}" + (" with warmup" if chained else "")
    keys = ", ".join(k for k in (saved if isinstance(saved, Mapping) else {}) if not k.startswith("_"))
    return f"another scheduler (state keys: {keys})"
