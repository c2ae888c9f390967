"""Measured optimizer-state bytes: the one place that counts them.

The bytes of every tensor in an optimizer's ``state``, this rank's share only:

* a sharded wrapper (zero_lab's or torch's ``ZeroRedundancyOptimizer``, FairScale's
  ``OSS``) is read through its local optimizer (``.optim``), so its figure is this
  rank's shard;
* a ``DTensor`` (FSDP2's state) counts its local shard (``to_local()``); its
  ``numel()`` is the global size.

Non-tensor entries (Python ints, floats) count nothing::

    optimizer_state_bytes(torch.optim.Adam(...))   # exp_avg + exp_avg_sq + step, bytes
"""

from __future__ import annotations

import sys
from typing import Any

import torch

__all__ = ["optimizer_state_bytes", "tensor_bytes"]


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds for ``tensor`` (a ``DTensor``: its local shard).

    ``torch.distributed.tensor`` is not imported here (≈ 0.8 s, on the path of every job
    before its ranks start): no tensor can be a ``DTensor`` unless that module is loaded."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    local = tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor.DTensor) else tensor
    return local.numel() * local.element_size()


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of every tensor in this rank's optimizer state (a wrapper's ``.optim`` if it has one)."""
    local = getattr(optimizer, "optim", optimizer)
    return sum(
        tensor_bytes(value) for state in local.state.values() for value in state.values() if torch.is_tensor(value)
    )
