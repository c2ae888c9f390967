"""``resume=`` checked before any rank starts (a rule of :mod:`zero_lab.app.check.rules`), nothing loaded.

The path holds a complete checkpoint short of ``steps``, and under ``resume_optimizer=strict`` its
LR schedule has this run's shape (the keys of the classes' ``state_dict``, chained ones included):
resuming a cosine run with ``scheduler=step`` would load ``T_max`` into a ``StepLR``. A DCP
checkpoint's files are checked once the config passed
(:func:`zero_lab.app.check.callback.refuse_bad_dcp_resume`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.optim.lr_scheduler import LRScheduler

from zero_lab.app.check.options import options_where
from zero_lab.app.check.scheduler import REFUSED, built_scheduler
from zero_lab.app.config.schema import enum_str
from zero_lab.app.record.checkpoint_finder import find_any, is_dcp, step_of_any
from zero_lab.app.run.checkpoints import read_dcp_extra
from zero_lab.checkpoint import CheckpointError, load_plain, read_manifest

__all__ = ["resume_problems"]

#: What reading a checkpoint's scheduler state can raise: an unreadable file, a manifest or record that
#: is not ours, a torch file refused or cut short (:func:`~zero_lab.checkpoint.load_plain`).
_UNREADABLE = (OSError, CheckpointError, KeyError, ValueError)


def resume_problems(cfg: DictConfig, choices: Mapping[str, Any], plan: object) -> list[str]:
    """One line per problem with the checkpoint ``resume=`` names (module docstring)."""
    if cfg.resume is None:
        return []
    path = Path(str(cfg.resume)).expanduser()
    if not path.exists():
        return [f"resume={cfg.resume}: no such file or directory; give a run dir, or one of its checkpoints/step_*"]
    found = find_any(path)
    if found is None:
        return [f"resume={cfg.resume}: holds no complete checkpoint; run with checkpoint_every=K to write some"]
    out = []
    step = step_of_any(found)
    if step is not None and step >= cfg.steps:
        out.append(
            f"resume={cfg.resume}: its checkpoint {found.name} is at step {step}; steps={cfg.steps} leaves nothing to "
            f"run (raise steps)"
        )
    if enum_str(cfg.get("resume_optimizer", "strict")) == "strict":
        out += _other_schedule(cfg, choices, found)
    return out


def _other_schedule(cfg: DictConfig, choices: Mapping[str, Any], found: Path) -> list[str]:
    """The checkpoint's scheduler state must be this run's kind, as ``resume_optimizer=strict`` loads it."""
    try:
        saved, mine = _saved_scheduler(found), built_scheduler(cfg)
    except (*_UNREADABLE, *REFUSED, OmegaConfBaseException):  # named by the ranks' loaders, the scheduler's rule
        return []
    if _shape_of(mine) == _state_shape(saved):
        return []
    here = f"scheduler={choices.get('scheduler') or cfg.scheduler.get('_target_')}"
    warmup = cfg.scheduler.get("warmup_steps", 0) if cfg.get("scheduler") is not None else 0
    here += f" with scheduler.warmup_steps={warmup}" if warmup else ""
    return [
        f"{here}: resume={cfg.resume} holds the LR schedule of {_describe(saved, cfg)}, and "
        "resume_optimizer=strict loads it into this run's; pick the scheduler (and scheduler.warmup_steps) it "
        "was saved with, or resume_optimizer=reset to start the schedule and optimizer fresh"
    ]


def _state_shape(state: Any) -> Any:
    """A scheduler state's shape: its keys, and those of the schedulers it chains (``_schedulers``)."""
    if isinstance(state, Mapping):
        return {str(k): _state_shape(v) if k == "_schedulers" else None for k, v in state.items()}
    if isinstance(state, list):
        return [_state_shape(s) for s in state]
    return None


def _shape_of(scheduler: LRScheduler | None) -> Any:
    """The shape of a built scheduler's state as a checkpoint's JSON holds it (``None``: no scheduler)."""
    return _state_shape(json.loads(json.dumps(scheduler.state_dict()))) if scheduler is not None else None


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
        return _shape_of(built_scheduler(trial)) == _state_shape(saved)

    if fitting := options_where("scheduler", fits):
        return f"scheduler={fitting[0]}" + (" with warmup" if chained else "")
    keys = ", ".join(k for k in (saved if isinstance(saved, Mapping) else {}) if not k.startswith("_"))
    return f"another scheduler (state keys: {keys})"
