"""DTensor parameters (torchtitan, FSDP2 meshes) are refused at construction, by name.

zero_lab shards a parameter's *elements* across the ranks of its process group and
exchanges them as plain tensors; a ``DTensor`` already carries its own placement over a
device mesh (torchtitan makes every parameter one, even for pure data parallelism), and
its ``.grad``, ``.data`` and in-place copies dispatch through DTensor's rules, so the
exchange would mix the two ("aten.copy_.default got mixed torch.Tensor and DTensor").
Rather than step wrongly, :func:`check_plain_params` raises a ``TypeError`` that names
the first DTensor parameter, its placements, and what to use instead.

    check_plain_params(self.all_params, names)   # in ZeroRedundancyOptimizer.__init__
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

__all__ = ["check_plain_params", "is_dtensor"]


def is_dtensor(tensor: torch.Tensor) -> bool:
    """True for a ``torch.distributed.tensor.DTensor``. Nothing is imported: a DTensor exists only
    once its module has been imported, so where ``torch.distributed.tensor`` is not in
    ``sys.modules`` (a plain DDP job; importing it costs about 0.7 s) nothing is one."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(tensor, dtensor)


def check_plain_params(params: Sequence[torch.Tensor], names: Sequence[object]) -> None:
    """Raise ``TypeError`` naming the first DTensor among ``params`` (``names``: each one's name
    where the groups carry ``param_names``, else anything that is not a ``str``)."""
    for index, (param, name) in enumerate(zip(params, names)):
        if is_dtensor(param):
            label = repr(name) if isinstance(name, str) else f"#{index}"
            raise TypeError(
                f"ZeroRedundancyOptimizer got a DTensor parameter {label} (placements {tuple(param.placements)} on "
                f"a {param.device_mesh.ndim}-D mesh): zero_lab shards and exchanges plain tensors. For data "
                "parallelism build the model with plain parameters and wrap it in torch's "
                "DistributedDataParallel (torchtitan: pass the plain model parts to the container, see "
                "docs/clients.md); to shard DTensor parameters use FSDP2 (torch.distributed.fsdp.fully_shard) "
                "instead of ZeRO"
            )
