"""Data: one global batch per step, a pure function of ``(seed, step)``.

Synthetic (``RegressionData``, ``TokenData``, ``ImageData``) or byte-level tokens of text files
(``TextData``: by default the Python standard library's own source, found wherever Python is).
Every rank builds the same global batch and keeps its contiguous slice of ``global_batch /
world_size`` rows; each rank's loss is the mean over its slice and DDP averages gradients over
ranks, so the gradient is the global-batch mean's at *any* world size: the same seed gives the
same trajectory with 1, 2 or 4 ranks (up to float rounding), and strategies compare on identical work.

    data = RegressionData(global_batch=32, in_dim=8, out_dim=8, seed=0)
    x, y = data.shard(step=3, rank=1, world_size=2)   # rows 16..31 of step 3's batch
"""

from __future__ import annotations

import functools
import hashlib
import math
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.nn import functional as F

__all__ = ["ImageData", "RegressionData", "TextData", "TokenData", "stream_seed"]


def stream_seed(*parts: int | str) -> int:
    """A 63-bit seed for an independent random stream named by ``parts`` (no collisions
    between e.g. ``(seed=0, step=10)`` and ``(seed=1, step=0)``)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


#: A batch: ``(inputs, targets)``.
Pair = tuple[torch.Tensor, torch.Tensor]


def _generator(*parts: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(*parts))


class _Synthetic:
    """Slicing shared by the synthetic tasks; subclasses define ``global_batch_at``."""

    task = ""

    def __init__(self, global_batch: int, seed: int):
        self.global_batch = global_batch
        self.seed = seed

    def global_batch_at(self, step: int, stream: str = "batch") -> Pair:
        """The global batch of ``step`` in the random stream ``stream`` (``"batch"``: training, ``"val"``: held out)."""
        raise NotImplementedError

    def shard(self, step: int, rank: int, world_size: int) -> Pair:
        """This rank's rows of step ``step``'s global batch."""
        return self._slice(self.global_batch_at(step), rank, world_size)

    def val_shard(self, index: int, rank: int, world_size: int) -> Pair:
        """This rank's rows of held-out batch ``index``: drawn from a stream training never reads."""
        return self._slice(self.global_batch_at(index, "val"), rank, world_size)

    def _slice(self, batch: Pair, rank: int, world_size: int) -> Pair:
        if self.global_batch % world_size:
            raise ValueError(f"global_batch={self.global_batch} is not divisible by world_size={world_size}")
        rows = self.global_batch // world_size
        inputs, targets = batch
        return inputs[rank * rows : (rank + 1) * rows], targets[rank * rows : (rank + 1) * rows]


class RegressionData(_Synthetic):
    """``x ~ N(0, I)``, ``y = tanh(x @ W) + noise``, ``W`` a fixed random teacher; MSE loss."""

    task = "regression"

    def __init__(self, global_batch: int, in_dim: int, out_dim: int, seed: int, noise: float = 0.01):
        super().__init__(global_batch, seed)
        self.in_dim, self.out_dim, self.noise = in_dim, out_dim, noise
        teacher = torch.randn(in_dim, out_dim, generator=_generator(seed, "teacher"))
        self.teacher = teacher / math.sqrt(in_dim)

    def global_batch_at(self, step: int, stream: str = "batch") -> Pair:
        gen = _generator(self.seed, stream, step)
        x = torch.randn(self.global_batch, self.in_dim, generator=gen)
        y = torch.tanh(x @ self.teacher) + self.noise * torch.randn(self.global_batch, self.out_dim, generator=gen)
        return x, y

    loss = staticmethod(F.mse_loss)


class TokenData(_Synthetic):
    """Sequences with ``t[i+1] = (a * t[i] + b) mod vocab_size`` from random starts; next-token CE."""

    task = "lm"

    def __init__(self, global_batch: int, vocab_size: int, seq_len: int, seed: int):
        super().__init__(global_batch, seed)
        self.vocab_size, self.seq_len = vocab_size, seq_len
        rule = torch.randint(1, vocab_size, (2,), generator=_generator(seed, "rule"))
        self.a, self.b = int(rule[0]), int(rule[1])

    def global_batch_at(self, step: int, stream: str = "batch") -> Pair:
        start = torch.randint(0, self.vocab_size, (self.global_batch, 1), generator=_generator(self.seed, stream, step))
        tokens = [start]
        for _ in range(self.seq_len):
            tokens.append((self.a * tokens[-1] + self.b) % self.vocab_size)
        seq = torch.cat(tokens, dim=1)
        return seq[:, :-1], seq[:, 1:]

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


class ImageData(_Synthetic):
    """Image classification: ``classes`` fixed random prototype images; a sample is its class's
    prototype plus Gaussian noise (``noise``), so a convolutional net learns it. Cross-entropy."""

    task = "image"

    def __init__(self, global_batch: int, seed: int, classes: int = 10, channels: int = 3, size: int = 32,
                 noise: float = 1.0):  # fmt: skip
        super().__init__(global_batch, seed)
        self.classes, self.noise = classes, noise
        self.prototypes = torch.randn(classes, channels, size, size, generator=_generator(seed, "prototypes"))

    def global_batch_at(self, step: int, stream: str = "batch") -> Pair:
        gen = _generator(self.seed, stream, step)
        labels = torch.randint(0, self.classes, (self.global_batch,), generator=gen)
        images = self.prototypes[labels] + self.noise * torch.randn(self.prototypes[labels].shape, generator=gen)
        return images, labels

    loss = staticmethod(F.cross_entropy)


def stdlib_source() -> Path:
    """The Python standard library's source folder: a text corpus on every machine with Python."""
    return Path(sysconfig.get_paths()["stdlib"])


class TextData(_Synthetic):
    """Byte-level language modelling on real text: the bytes of a file, or of every file
    matching ``pattern`` under a folder (sorted, concatenated, at most ``max_bytes``), are the
    tokens (vocabulary 256). The last ``val_fraction`` of them is held out for ``val_shard``.
    Each step's global batch is ``global_batch`` windows of ``seq_len + 1`` bytes at offsets
    drawn from ``(seed, step)``; inputs are the first ``seq_len``, targets the next ``seq_len``.
    ``path=null`` reads the standard library's ``*.py`` files."""

    task = "lm"
    vocab_size = 256

    def __init__(self, global_batch: int, seq_len: int, seed: int, path: str | None = None, pattern: str = "**/*.py",
                 max_bytes: int = 8 * 2**20, val_fraction: float = 0.05):  # fmt: skip
        super().__init__(global_batch, seed)
        self.seq_len = seq_len
        self.path = Path(path).expanduser() if path else stdlib_source()
        tokens = torch.frombuffer(bytearray(_read_text(self.path, pattern, max_bytes)), dtype=torch.uint8).long()
        held_out = max(int(len(tokens) * val_fraction), seq_len + 1)
        if len(tokens) - held_out < seq_len + 1:
            raise ValueError(
                f"path={self.path}: {len(tokens)} bytes are too few for seq_len={seq_len} with a held-out part; "
                "give more text or a shorter seq_len"
            )
        self.train_tokens, self.val_tokens = tokens[:-held_out], tokens[-held_out:]

    def global_batch_at(self, step: int, stream: str = "batch") -> Pair:
        tokens = self.val_tokens if stream == "val" else self.train_tokens
        starts = torch.randint(
            0, len(tokens) - self.seq_len, (self.global_batch,), generator=_generator(self.seed, stream, step)
        )
        windows = torch.stack([tokens[s : s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]

    loss = staticmethod(TokenData.loss)  # next-token cross-entropy, as for TokenData


@functools.lru_cache(maxsize=4)  # a process reads one corpus once (the config check, the build and tests reuse it)
def _read_text(path: Path, pattern: str, max_bytes: int) -> bytes:
    """``path``'s bytes, or the sorted files under it matching ``pattern``, up to ``max_bytes``:
    each file is read only up to what is still missing (a 16 GiB corpus costs ``max_bytes``).
    A missing path or no matching file is a ``FileNotFoundError``, no bytes at all a ``ValueError``,
    each naming ``data.path``."""
    if max_bytes < 1:
        raise ValueError(f"data.max_bytes={max_bytes}: must be >= 1 (bytes of text to read)")
    if path.is_file():
        files: Sequence[Path] = [path]
    elif path.is_dir():
        files = _matching_files(path, pattern)
        if not files:
            raise FileNotFoundError(f"data.path={path}: no file matches data.pattern={pattern}")
    else:
        raise FileNotFoundError(f"data.path={path}: no such file or folder")
    chunks, size = [], 0
    for file in files:
        with open(file, "rb") as handle:
            chunks.append(handle.read(max_bytes - size))
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    if not size:
        where = "is empty" if path.is_file() else f"holds only empty files matching data.pattern={pattern}"
        raise ValueError(f"data.path={path}: {where}; give a file or folder with text")
    return b"".join(chunks)


@functools.lru_cache(maxsize=4)  # the standard library's 5,000 files are listed once, whatever max_bytes asks
def _matching_files(folder: Path, pattern: str) -> tuple[Path, ...]:
    """The files under ``folder`` matching ``pattern``, sorted, without installed packages."""
    installed = {"site-packages", "dist-packages"}  # the standard library's folder may hold installed packages
    found = [p for p in folder.glob(pattern) if p.is_file() and not installed & set(p.relative_to(folder).parts[:-1])]
    return tuple(sorted(found))
