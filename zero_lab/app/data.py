"""Synthetic data: one global batch per step, a pure function of ``(seed, step)``.

Every rank builds the same global batch and keeps its contiguous slice of
``global_batch / world_size`` rows. Each rank's loss is the mean over its slice and DDP
averages gradients over ranks, so the gradient is that of the global-batch mean at *any*
world size: the same seed gives the same trajectory with 1, 2 or 4 ranks (up to float
rounding), and strategies are always compared on identical work.

    data = RegressionData(global_batch=32, in_dim=8, out_dim=8, seed=0)
    x, y = data.shard(step=3, rank=1, world_size=2)   # rows 16..31 of step 3's batch
    loss = data.loss(model(x), y)
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch.nn import functional as F

__all__ = ["RegressionData", "TokenData", "stream_seed"]


def stream_seed(*parts: int | str) -> int:
    """A 63-bit seed for an independent random stream named by ``parts`` (no collisions
    between e.g. ``(seed=0, step=10)`` and ``(seed=1, step=0)``)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _generator(*parts: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(*parts))


class _Synthetic:
    """Slicing shared by the synthetic tasks; subclasses define ``global_batch_at``."""

    task = ""

    def __init__(self, global_batch: int, seed: int):
        self.global_batch = global_batch
        self.seed = seed

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def shard(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of step ``step``'s global batch."""
        if self.global_batch % world_size:
            raise ValueError(f"global_batch={self.global_batch} is not divisible by world_size={world_size}")
        rows = self.global_batch // world_size
        inputs, targets = self.global_batch_at(step)
        return inputs[rank * rows : (rank + 1) * rows], targets[rank * rows : (rank + 1) * rows]


class RegressionData(_Synthetic):
    """``x ~ N(0, I)``, ``y = tanh(x @ W) + noise``, ``W`` a fixed random teacher; MSE loss."""

    task = "regression"

    def __init__(self, global_batch: int, in_dim: int, out_dim: int, seed: int, noise: float = 0.01):
        super().__init__(global_batch, seed)
        self.in_dim, self.out_dim, self.noise = in_dim, out_dim, noise
        teacher = torch.randn(in_dim, out_dim, generator=_generator(seed, "teacher"))
        self.teacher = teacher / math.sqrt(in_dim)

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = _generator(self.seed, "batch", step)
        x = torch.randn(self.global_batch, self.in_dim, generator=gen)
        y = torch.tanh(x @ self.teacher) + self.noise * torch.randn(self.global_batch, self.out_dim, generator=gen)
        return x, y

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target)


class TokenData(_Synthetic):
    """Sequences with ``t[i+1] = (a * t[i] + b) mod vocab_size`` from random starts; next-token CE."""

    task = "lm"

    def __init__(self, global_batch: int, vocab_size: int, seq_len: int, seed: int):
        super().__init__(global_batch, seed)
        self.vocab_size, self.seq_len = vocab_size, seq_len
        rule = torch.randint(1, vocab_size, (2,), generator=_generator(seed, "rule"))
        self.a, self.b = int(rule[0]), int(rule[1])

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(
            0, self.vocab_size, (self.global_batch, 1), generator=_generator(self.seed, "batch", step)
        )
        tokens = [start]
        for _ in range(self.seq_len):
            tokens.append((self.a * tokens[-1] + self.b) % self.vocab_size)
        seq = torch.cat(tokens, dim=1)
        return seq[:, :-1], seq[:, 1:]

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
