"""Failures inside a rank's loop, said in the app's words instead of torch's or Python's.

* :func:`unused_parameters` — DDP's "Expected to have finished reduction in the prior iteration"
  (raised at the forward *after* a step that left a parameter without a gradient) names torch's
  keyword argument and parameter **indices**: positions in DDP's own list (the module's parameters
  that require a gradient, minus ``parameters_to_ignore``), so they map back to names, said with
  the app's key ``dist.find_unused_parameters=true``. The check before start
  (:func:`zero_lab.app.workloads.protocols.forward_problems`) catches a parameter unused from the
  first step; this one catches a parameter that goes unused later.
* :func:`next_batch` — data that runs out before ``steps`` raised a bare ``StopIteration``;
  :class:`DataExhausted` names the rank, the step and the data option.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = ["DataExhausted", "UnusedParameters", "next_batch", "unused_parameters"]

_DDP_UNUSED = "Expected to have finished reduction in the prior iteration"
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


class UnusedParameters(RuntimeError):
    """Parameters got no gradient in a step after they had one; DDP was not told to expect it."""


class DataExhausted(RuntimeError):
    """A rank's data yielded no batch for a step the run still has to train."""


def unused_parameters(error: BaseException, ddp: nn.Module, step: int) -> UnusedParameters | None:
    """The app's error for DDP's unused-parameter error ``error`` raised at ``step``, else ``None``."""
    text = str(error)
    if _DDP_UNUSED not in text:
        return None
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())  # DDP's parameters, as its reducer numbers them
    module = getattr(ddp, "module", ddp)
    names = [name for name, param in module.named_parameters() if param.requires_grad and name not in ignored]
    found = _INDICES.search(text)
    indices = [int(i) for i in found.group(2).split()] if found else []
    named = [names[i] if i < len(names) else f"#{i}" for i in indices]
    shown = ", ".join(named[:8]) + (f" and {len(named) - 8} more" if len(named) > 8 else "")
    which = f"{len(named)} parameter(s) ({shown})" if named else "some parameters"
    return UnusedParameters(
        f"{which} got no gradient in the backward before step {step}, though they had one in earlier steps; DDP "
        "refuses that unless told to expect it: set dist.find_unused_parameters=true (or make the model use every "
        "parameter in every step)"
    )


def next_batch(batches: Iterator[Any], rank: int, step: int, steps: int, data: str) -> Any:
    """The next batch of ``batches``; :class:`DataExhausted` naming ``rank``, ``step`` and the
    data option ``data`` (e.g. ``data=mydata (my_pkg.MyData)``) when there is none."""
    try:
        return next(batches)
    except StopIteration:
        raise DataExhausted(
            f"rank {rank}'s data ran out at step {step} of {steps}: {data} yields no more batches for rank {rank}; "
            "every rank needs one batch per step: give it more data (or let its batches() cycle), or lower steps"
        ) from None
