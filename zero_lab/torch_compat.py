"""The private names of torch's ``ZeroRedundancyOptimizer`` that code written for it reads.

Code written for ``torch.distributed.optim.ZeroRedundancyOptimizer`` — custom
``JoinHook``s such as the one torch's own Join test uses, logging helpers, FairScale-era
utilities — reads a handful of its private attributes: ``_all_params``,
``_param_to_index``, ``_index_to_param``, ``_param_to_rank``, ``_partition_parameters()``,
``_device_to_params_per_rank``. :class:`TorchPrivateNames` serves them, read-only and
derived from zero_lab's own state (the param groups and the partition), so they are
always true. Where zero_lab's partition has no torch equivalent — a partitioner that cuts a
parameter into element ranges on several ranks (``Flat``, ``DdpBucket(shard_buckets=True)``)
— the per-rank maps raise a ``RuntimeError`` that says so instead of answering wrongly.

    for p, grad in zip(opt._all_params, grads):   # as torch's Join test does
        p.grad = grad
"""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["TORCH_PRIVATE_NAMES", "TorchPrivateNames"]

#: The names served (torch's ``initialized`` flag and its private maps), in torch's order.
TORCH_PRIVATE_NAMES = (
    "initialized",
    "_all_params",
    "_param_to_rank",
    "_param_to_index",
    "_index_to_param",
    "_partition_parameters",
    "_device_to_params_per_rank",
    "_default_device",
    "_overlap_with_ddp",
    "_optim_defaults",
    "_local_step",
    "_sync_param_groups",
)


class TorchPrivateNames:
    """Mixin for :class:`zero_lab.ZeroRedundancyOptimizer`: torch's private read-only maps."""

    # Provided by the optimizer this is mixed into.
    param_groups: list[dict[str, Any]]
    all_params: list[torch.Tensor]
    world_size: int
    partition: Any

    @property
    def initialized(self) -> bool:
        """True once the constructor finished (torch's public flag)."""
        return bool(getattr(self, "_initialized", False))

    @property
    def _all_params(self) -> list[torch.Tensor]:
        """Every parameter, param groups in order (torch's ``_all_params``: the optimizer's ``all_params``)."""
        return self.all_params

    @property
    def _param_to_index(self) -> dict[torch.Tensor, int]:
        """Parameter -> its index in the global optimizer state (``state_dict`` numbering)."""
        return {p: i for i, p in enumerate(self._all_params)}

    @property
    def _index_to_param(self) -> list[torch.Tensor]:
        """Global index -> parameter."""
        return self._all_params

    @property
    def _param_to_rank(self) -> dict[torch.Tensor, int]:
        """Parameter -> the rank that steps it (whole-parameter partitions only)."""
        owners = self._whole_owners("_param_to_rank")
        return dict(zip(self._all_params, owners))

    def _partition_parameters(self, params_per_rank: list[list[torch.Tensor]] | None = None) -> list[list[dict]]:
        """Per rank, its param groups holding only the parameters it steps (torch's layout:
        ``[rank][group] -> dict`` with every hyper-parameter of the group). A manual
        ``params_per_rank`` is zero_lab's ``Manual`` partitioner, given at construction."""
        if params_per_rank is not None:
            raise ValueError(
                "_partition_parameters(params_per_rank) does not repartition in zero_lab; pass "
                "partitioner=zero_lab.Manual(params_per_rank) to the constructor instead"
            )
        owners = self._whole_owners("_partition_parameters")
        out: list[list[dict]] = [[] for _ in range(self.world_size)]
        index = 0
        for group in self.param_groups:
            members: list[list[torch.Tensor]] = [[] for _ in range(self.world_size)]
            for param in group["params"]:
                members[owners[index]].append(param)
                index += 1
            for rank in range(self.world_size):
                per_rank = copy.copy(group)
                per_rank["params"] = members[rank]
                out[rank].append(per_rank)
        return out

    @property
    def _device_to_params_per_rank(self) -> dict[torch.device, list[list[torch.Tensor]]]:
        """Device -> per rank, the parameters on that device the rank steps."""
        owners = self._whole_owners("_device_to_params_per_rank")
        out: dict[torch.device, list[list[torch.Tensor]]] = {}
        for param, rank in zip(self._all_params, owners):
            out.setdefault(param.device, [[] for _ in range(self.world_size)])[rank].append(param)
        return out

    def _whole_owners(self, name: str) -> list[int]:
        """The owner of each parameter, or a ``RuntimeError`` naming a parameter split over ranks."""
        partition = self.partition
        if not partition.is_whole:
            cut = partition.cut_params()[0]
            raise RuntimeError(
                f"{name} maps each parameter to one rank, but this optimizer's partitioner "
                f"cuts parameter #{cut} into element ranges on several ranks; read opt.partition.shards "
                "(or use a whole-parameter partitioner such as SortedGreedy) instead"
            )
        return partition.owners()
