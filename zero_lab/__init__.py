"""zero_lab: ZeRO-style optimizer-state sharding for PyTorch, configurable piece by piece.

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.partition import Flat
opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=Flat(), lr=1e-3)
"""

from zero_lab.optimizer import ELEMENTWISE_OPTIMIZERS, ZeroRedundancyOptimizer
from zero_lab.partition import Flat, Manual, ParamSpec, Partition, Partitioner, SortedGreedy

ShardedOptimizer = ZeroRedundancyOptimizer

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "Flat",
    "Manual",
    "ParamSpec",
    "Partition",
    "Partitioner",
    "ShardedOptimizer",
    "SortedGreedy",
    "ZeroRedundancyOptimizer",
]
