"""zero_lab: ZeRO-style optimizer-state sharding for PyTorch, configurable piece by piece.

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.partition import Flat
opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=Flat(), lr=1e-3)
"""

from zero_lab.chained import ChainedOptimizer, merge_state_dicts, split_state_dict
from zero_lab.collectives import Collective, register_collective
from zero_lab.elementwise import ELEMENTWISE_OPTIMIZERS, is_elementwise, register_elementwise
from zero_lab.engine import ShardedDataParallel
from zero_lab.grad_reduce import GradReduce, reduce_gradients, register_grad_reduce
from zero_lab.optimizer import ZeroRedundancyOptimizer
from zero_lab.partition import Flat, Manual, ParamSpec, Partition, Partitioner, SortedGreedy
from zero_lab.routing import muon_param_groups

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "ChainedOptimizer",
    "Collective",
    "Flat",
    "GradReduce",
    "Manual",
    "ParamSpec",
    "Partition",
    "Partitioner",
    "ShardedDataParallel",
    "SortedGreedy",
    "ZeroRedundancyOptimizer",
    "is_elementwise",
    "merge_state_dicts",
    "muon_param_groups",
    "reduce_gradients",
    "register_collective",
    "register_elementwise",
    "register_grad_reduce",
    "split_state_dict",
]
