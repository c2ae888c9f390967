"""The benchmark's models and their synthetic data, built from the app's model classes.

A :class:`ModelPreset` couples a model builder with a deterministic batch function:
``batch(step, rank)`` is the same for every strategy, so all of them see the same data.
The models are the app's :class:`~zero_lab.app.workloads.models.MLP` and
:class:`~zero_lab.app.workloads.models.TinyLM` (the LM with its head tied to the token embedding,
as GPT-2 does)::

    preset = MODELS["tutorial"]
    model = preset.build()
    x, y = preset.batch(step=0, rank=1)
    preset.loss(model(x), y).backward()
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from zero_lab.app.workloads.models import MLP, ResNet, TinyLM
from zero_lab.app.workloads.protocols import OUTPUT_KEY

__all__ = ["MODELS", "PLAN_ONLY", "ModelPreset", "blocks_of", "tied_lm"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ModelPreset:
    """A model and its synthetic data; ``batch(step, rank)`` is the same for every strategy."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, int], Batch]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def tied_lm(vocab: int, seq_len: int, d_model: int, n_layer: int) -> TinyLM:
    """The app's TinyLM (4 heads) with the LM head tied to the token embedding."""
    model = TinyLM(vocab, seq_len, d_model, n_layer, n_head=4)
    model.head.weight = model.tok_emb.weight
    return model


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a benchmark model (FSDP2 shards each one on its own)."""
    if isinstance(model, TinyLM):
        return list(model.blocks)
    if isinstance(model, MLP):
        return list(model.layers)
    if isinstance(model, ResNet):
        return [block for stage in model.stages for block in stage]
    inner = getattr(model, "transformer", None) or getattr(model, "model", None)  # transformers' GPT-2 / Llama
    for name in ("h", "layers"):
        if inner is not None and isinstance(getattr(inner, name, None), nn.ModuleList):
            return list(getattr(inner, name))
    raise TypeError(f"no block structure known for {type(model).__name__}")


def _generator(step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 * step + rank)


def _regression_batch(batch: int, width: int) -> Callable[[int, int], Batch]:
    def make(step: int, rank: int) -> Batch:
        g = _generator(step, rank)
        return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)

    return make


def _lm_batch(batch: int, seq_len: int, vocab: int) -> Callable[[int, int], Batch]:
    def make(step: int, rank: int) -> Batch:
        tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=_generator(step, rank))
        return tokens[:, :-1], tokens[:, 1:]

    return make


def _lm_loss(logits: Any, targets: torch.Tensor) -> torch.Tensor:
    logits = logits[OUTPUT_KEY] if isinstance(logits, Mapping) else logits  # a transformers ModelOutput
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _image_batch(batch: int, classes: int) -> Callable[[int, int], Batch]:
    def make(step: int, rank: int) -> Batch:
        g = _generator(step, rank)
        return torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, classes, (batch,), generator=g)

    return make


def _hf(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    """A ``zero_lab.app.workloads.hf_models`` class (the [models] extra), imported when the preset is built."""

    def build() -> nn.Module:
        return getattr(importlib.import_module("zero_lab.app.workloads.hf_models"), name)(**kwargs)

    return build


def _tutorial(depth: int) -> Callable[[], nn.Module]:
    return lambda: MLP(2000, 2000, 2000, depth, activation=None)


MODELS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "tutorial",
            "20×Linear(2000,2000), batch 20, MSE (torch's ZeRO tutorial)",
            _tutorial(20),
            _regression_batch(20, 2000),
            F.mse_loss,
        ),
        ModelPreset(
            "tutorial-quick",
            "4×Linear(2000,2000) (the tutorial, 4 of its 20 layers), batch 20, MSE",
            _tutorial(4),
            _regression_batch(20, 2000),
            F.mse_loss,
        ),
        ModelPreset(
            "linear768",
            "12×Linear(768,768), batch 16, MSE (issue 27's model: the step is mostly communication)",
            lambda: MLP(768, 768, 768, 12, activation=None),
            _regression_batch(16, 768),
            F.mse_loss,
        ),
        ModelPreset(
            "lm",
            "tied-embedding LM: vocab 32000 × d 256, 4 blocks, 2×64 tokens",
            lambda: tied_lm(32_000, 64, 256, 4),
            _lm_batch(2, 64, 32_000),
            _lm_loss,
        ),
        ModelPreset(
            "lm-quick",
            "tied-embedding LM: vocab 32000 × d 256, 2 blocks, 2×32 tokens",
            lambda: tied_lm(32_000, 32, 256, 2),
            _lm_batch(2, 32, 32_000),
            _lm_loss,
        ),
        ModelPreset(
            "gpt2-small",
            "transformers GPT-2, tied: vocab 50257 × d 256, 4 layers, 2×64 tokens (model=gpt2's class)",
            _hf("GPT2", vocab_size=50_257, n_positions=64, n_embd=256, n_layer=4, n_head=4),
            _lm_batch(2, 64, 50_257),
            _lm_loss,
        ),
        ModelPreset(
            "llama-small",
            "transformers Llama, tied, GQA: vocab 32000 × d 256, 4 layers, 2×64 tokens (model=llama's class)",
            _hf(
                "Llama",
                vocab_size=32_000,
                hidden_size=256,
                intermediate_size=688,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
            ),
            _lm_batch(2, 64, 32_000),
            _lm_loss,
        ),
        ModelPreset(
            "resnet",
            "ResNet with BatchNorm, 3 stages × 2 blocks, 32-128 channels, 8 images 32×32 (model=resnet)",
            lambda: ResNet(classes=10, width=32, blocks=[2, 2, 2]),
            _image_batch(8, 10),
            F.cross_entropy,
        ),
        ModelPreset(
            "tiny",
            "MLP 16→48→48→16, tanh (for tests)",
            lambda: MLP(16, 48, 16, 3, activation="tanh"),
            _regression_batch(4, 16),
            F.mse_loss,
        ),
    )
}

#: Models only the planner sees (built on the meta device): GPT-2 shapes, head tied.
PLAN_ONLY: dict[str, Callable[[], nn.Module]] = {
    "hf-gpt2": _hf("GPT2", vocab_size=50_257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    "gpt2": lambda: tied_lm(50_257, 1024, 768, 12),
    "gpt2-xl": lambda: tied_lm(50_257, 1024, 1600, 48),
}
