"""The LR scheduler checked before start by torch's own classes, on a one-tensor optimizer.

A scheduler's constructor checks its arguments only in part: ``StepLR(step_size=0)`` builds, and
fails at its first ``step()`` in every rank. So the run's scheduler is built as the ranks build it
(:func:`zero_lab.app.run.build.make_scheduler`, warmup included) on a dummy ``SGD`` over one
``meta`` tensor and stepped as many times as the run will (up to :data:`_STEPS_CHECKED`); a
refusal names the configured keys the error or the failing line of torch's code reads.
"""

from __future__ import annotations

import inspect
import linecache
import re
import traceback
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from hydra.errors import HydraException
from hydra.utils import get_object
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from torch.optim.lr_scheduler import LRScheduler

from zero_lab.app.config.schema import APP_KEYS, HYDRA_KEYS
from zero_lab.app.config.targets import refusal
from zero_lab.app.run.build import make_scheduler

__all__ = ["REFUSED", "built_scheduler", "scheduler_problems"]

_STEPS_CHECKED = 10_000  # at most this many steps before start (about 0.2 s on a busy core)

#: What a scheduler class raises for arguments it refuses, built or stepped: range checks, an argument
#: it lacks, ``StepLR(step_size=0)``'s ZeroDivisionError, an index past what it holds, a tensor operation
#: refused; Hydra's InstantiationException around any of them.
REFUSED = (ValueError, TypeError, ArithmeticError, LookupError, RuntimeError, HydraException)


def built_scheduler(cfg: DictConfig) -> LRScheduler | None:
    """This run's scheduler on an SGD over one meta tensor at ``optim.lr``, as :func:`make_scheduler` builds
    it (``None``: ``scheduler=none``). ``cfg`` needs only ``scheduler`` (and what it interpolates)."""
    optim = cfg.get("optim")
    lr = optim.get("lr") if optim is not None else None
    param = torch.zeros(1, device="meta", requires_grad=True)  # a scheduler reads the groups' lr, never a tensor
    optimizer = torch.optim.SGD([param], lr=lr if isinstance(lr, float) else 1e-3)
    return make_scheduler(cfg, optimizer)


def scheduler_problems(cfg: DictConfig, choices: Mapping[str, Any], plan: object) -> list[str]:
    """A rule of :mod:`zero_lab.app.check.rules`: build the run's scheduler and step it ``min(steps,
    _STEPS_CHECKED)`` times; one line naming the keys to blame when torch's class refuses."""
    node = cfg.get("scheduler")
    if node is None or node.get("_target_") is None:
        return []
    step = 0
    try:
        scheduler = built_scheduler(cfg)
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": nothing to step here
            warnings.simplefilter("ignore")
            while step < min(int(cfg.steps), _STEPS_CHECKED):
                step += 1
                scheduler.step()  # type: ignore[union-attr]
    except OmegaConfBaseException:  # an interpolation that does not resolve: the composition's to name
        return []
    except REFUSED as error:  # the scheduler's class refuses its arguments: named with its keys
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
