"""Models for experiments: an MLP, a GPT-style causal LM and a ResNet with BatchNorm.

Each declares ``task`` ("regression", "lm" or "image") so the config check can match it with
a data option (zero_lab/app/workloads/protocols.py), and names its parameters plainly
(``layers.0.weight``, ``blocks.1.attn.qkv.weight``, ``stages.0.0.conv1.weight``) so
``partitioner=manual`` globs are easy to write. ``transformers`` GPT-2 and Llama models are in
:mod:`zero_lab.app.workloads.hf_models` (the ``[models]`` extra).

    model = MLP(in_dim=2000, hidden=2000, out_dim=2000, depth=20, activation=None)  # the tutorial
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MLP", "ResNet", "TinyLM"]

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


class MLP(nn.Module):
    """``depth`` Linear layers ``in_dim -> hidden -> ... -> out_dim``, activation between."""

    task = "regression"

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        depth: int,
        activation: str | None = "tanh",
        bias: bool = True,
    ):
        super().__init__()
        if activation not in _ACTIVATIONS and activation is not None:
            raise ValueError(f"activation must be one of {[*_ACTIVATIONS, None]}, got {activation!r}")
        dims = [in_dim] + [hidden] * (depth - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in itertools.pairwise(dims))
        self.act = _ACTIVATIONS[activation]() if activation else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < len(self.layers) - 1:
                x = self.act(x)
        return x


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP.

    ``n_kv_head`` (grouped-query attention): separate ``q`` (d × d), ``k`` and ``v``
    (n_kv_head·head_dim × d) projections, each K/V head shared by n_head / n_kv_head query
    heads; ``None`` keeps one fused ``qkv`` projection. ``n_expert`` narrow experts
    (``expert_dim`` × d and d × ``expert_dim``) run beside the MLP on every token, their
    outputs averaged: a dense stand-in with the *shapes* of MoE experts (many narrow
    matrices), which is what decides how Muon's step cost spreads over ranks.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        mlp_ratio: int,
        n_kv_head: int | None = None,
        n_expert: int = 0,
        expert_dim: int = 16,
    ):
        super().__init__()
        self.n_head = n_head
        self.n_kv_head = n_kv_head
        self.ln1 = nn.LayerNorm(d_model)
        if n_kv_head is None:
            self.qkv = nn.Linear(d_model, 3 * d_model)
        else:
            kv_dim = n_kv_head * (d_model // n_head)
            self.q = nn.Linear(d_model, d_model)
            self.k = nn.Linear(d_model, kv_dim)
            self.v = nn.Linear(d_model, kv_dim)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, mlp_ratio * d_model)
        self.out = nn.Linear(mlp_ratio * d_model, d_model)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, expert_dim), nn.GELU(), nn.Linear(expert_dim, d_model))
            for _ in range(n_expert)
        )

    def _qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, seq, width = h.shape
        head_dim = width // self.n_head
        if self.n_kv_head is None:
            q, k, v = self.qkv(h).split(width, dim=-1)
            return tuple(t.view(batch, seq, self.n_head, head_dim).transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]
        q = self.q(h).view(batch, seq, self.n_head, head_dim).transpose(1, 2)
        repeat = self.n_head // self.n_kv_head
        k, v = (
            proj(h).view(batch, seq, self.n_kv_head, head_dim).transpose(1, 2).repeat_interleave(repeat, dim=1)
            for proj in (self.k, self.v)
        )
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self._qkv(self.ln1(x))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, width))
        h = self.ln2(x)
        x = x + self.out(F.gelu(self.fc(h)))
        if len(self.experts):
            x = x + torch.stack([expert(h) for expert in self.experts]).mean(0)
        return x


class TinyLM(nn.Module):
    """A GPT-style causal language model: token + position embeddings, blocks, LM head.

    ``n_kv_head`` makes attention grouped-query (narrow K/V matrices) and ``n_expert`` adds
    narrow expert matrices beside each MLP: mixed aspect ratios, for Muon's step cost.
    """

    task = "lm"

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layer: int,
        n_head: int,
        mlp_ratio: int = 4,
        n_kv_head: int | None = None,
        n_expert: int = 0,
        expert_dim: int = 16,
    ):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        if n_kv_head is not None and (n_kv_head < 1 or n_head % n_kv_head):
            raise ValueError(f"n_kv_head ({n_kv_head}) must divide n_head ({n_head}), or be null for fused qkv")
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            _Block(d_model, n_head, mlp_ratio, n_kv_head, n_expert, expert_dim) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class _BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual (1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet: 3x3 stem, ``len(blocks)`` stages of basic blocks (widths ``width *
    2**i``, stride 2 from the second stage on), BatchNorm throughout, global pooling, a linear
    classifier. ``blocks=[2, 2, 2, 2]`` with ``width=64`` is ResNet-18's layout."""

    task = "image"

    def __init__(self, classes: int = 10, channels: int = 3, width: int = 16, blocks: list[int] | None = None):
        super().__init__()
        blocks = list(blocks or [2, 2, 2])
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages, cin = [], width
        for index, count in enumerate(blocks):
            cout = width * 2**index
            layers = [_BasicBlock(cin if i == 0 else cout, cout, 2 if index and i == 0 else 1) for i in range(count)]
            stages.append(nn.Sequential(*layers))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))
