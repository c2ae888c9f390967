"""Training helpers shared by the Gloo-world tests: one small model, per-rank batches,
the ZeRO-or-plain optimizer builder and the DDP-parity program that several layers of
tests run (``parity``: ZeRO and DDP + the plain optimizer trained side by side in one world).

Rank programs used by a single test module live in that module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import Partitioner

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adam": (torch.optim.Adam, {"lr": 1e-2}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    "sgd": (torch.optim.SGD, {"lr": 5e-2, "momentum": 0.9}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 1e-3}),
    "adagrad": (torch.optim.Adagrad, {"lr": 1e-2}),
}


def make_model(seed: int = 0, width: int = 24) -> nn.Module:
    """A small MLP with parameters of varied sizes (so partitions are uneven); ``width`` is its
    hidden size (24: 1083 elements, a multiple of 3; 23: 1016, not one)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(12, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 6), nn.Tanh(),
        nn.Linear(6, 3),
    )  # fmt: skip


def batch(step: int, rank: int, n: int = 8) -> torch.Tensor:
    """This rank's inputs at ``step`` (different per rank and step, same on every run)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 12, generator=g)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def accumulated_backward(wrapped: nn.Module, step: int, rank: int, accumulate: int = 1) -> torch.Tensor:
    """Backward of ``accumulate`` micro-batches of ``step`` (batches ``10·step + micro``), all but the
    last inside ``wrapped.no_sync()``; returns the last micro-batch's loss."""
    for micro in range(accumulate - 1):
        with wrapped.no_sync():
            loss_of(wrapped, batch(10 * step + micro, rank)).backward()
    loss = loss_of(wrapped, batch(10 * step + accumulate - 1, rank))
    loss.backward()
    return loss


def max_diff(a: Any, b: Any) -> float:
    """Largest absolute elementwise difference between two sequences of tensors."""
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def zero_or_plain(mode: str, params: Any, cls: type = torch.optim.Adam, **kwargs: Any) -> torch.optim.Optimizer:
    """``ZeroRedundancyOptimizer(params, cls, **kwargs)`` for mode "zero", else ``cls(params, ...)``
    (``partitioner`` only goes to ZeRO)."""
    if mode == "zero":
        return ZeroRedundancyOptimizer(params, cls, **kwargs)
    kwargs.pop("partitioner", None)
    return cls(params, **kwargs)


def param_groups(model: nn.Module, layout: str) -> Any:
    if layout == "tensors":
        return list(model.parameters())
    if layout == "named":
        return list(model.named_parameters())
    # two groups: no weight decay and a lower lr on biases
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 3e-3}]


@dataclass
class Case:
    """One parity scenario: ZeRO vs DDP + the plain optimizer on identical data."""

    optimizer: str = "adam"
    bucket_view: bool = False
    partitioner: Partitioner | None = None
    layout: str = "tensors"  # tensors | named | groups
    steps: int = 10
    frozen: tuple[int, ...] = ()  # parameter indices frozen from the start
    unfreeze_at: int | None = None  # step at which frozen parameters become trainable
    freeze_at: int | None = None  # step at which parameter 0 gets frozen
    closure: bool = False
    scheduler: bool = False
    clip: float | None = None  # clip the global gradient norm to this before each step
    norm_type: float = 2.0
    width: int = 24  # make_model's hidden size
    extra: dict[str, Any] = field(default_factory=dict)


def _build(case: Case, zero: bool) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = make_model(width=case.width)
    for index, param in enumerate(model.parameters()):
        param.requires_grad_(index not in case.frozen)
    ddp = DDP(model)
    cls, kwargs = OPTIMIZERS[case.optimizer]
    params = param_groups(model, case.layout)
    if zero:
        opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            params, cls, parameters_as_bucket_view=case.bucket_view, partitioner=case.partitioner, **kwargs
        )
    else:
        opt = cls(params, **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if case.scheduler else None
    return ddp, opt, sched


def _train(case: Case, zero: bool) -> tuple[nn.Module, list[float], Any]:
    ddp, opt, sched = _build(case, zero)
    model = ddp.module
    losses: list[float] = []
    norms: list[float] = []
    for step in range(case.steps):
        if step == case.unfreeze_at:
            for p in model.parameters():
                p.requires_grad_(True)
            ddp, model = _rewrap(ddp)
        if step == case.freeze_at:
            next(model.parameters()).requires_grad_(False)
            ddp, model = _rewrap(ddp)
        x = batch(step, dist.get_rank())

        def closure(ddp: nn.Module = ddp, x: torch.Tensor = x) -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(ddp, x)
            loss.backward()
            return loss

        if case.closure:
            loss = opt.step(closure)
        else:
            loss = closure()
            if case.clip is not None:
                norms.append(float(_clip(opt, model, case.clip, case.norm_type)))
            opt.step()
        losses.append(float(loss))
        if sched is not None:
            sched.step()
    opt.grad_norms = norms  # type: ignore[attr-defined]
    return model, losses, opt


def _clip(opt: torch.optim.Optimizer, model: nn.Module, max_norm: float, norm_type: float) -> torch.Tensor:
    if isinstance(opt, ZeroRedundancyOptimizer):
        return opt.clip_grad_norm_(max_norm, norm_type)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)


def _rewrap(ddp: DDP) -> tuple[DDP, nn.Module]:
    """DDP fixes its trainable set at construction; rebuild it after a change."""
    model = ddp.module
    return DDP(model), model


def parity(cases: list[Case]) -> list[dict[str, Any]]:
    """For each case: max |ZeRO - reference| over parameters, losses, state bytes."""
    out = []
    for case in cases:
        zero_model, zero_losses, zero_opt = _train(case, zero=True)
        ref_model, ref_losses, ref_opt = _train(case, zero=False)
        diff = max_diff(zero_model.parameters(), ref_model.parameters())
        out.append(
            {
                "max_diff": diff,
                "zero_losses": zero_losses,
                "ref_losses": ref_losses,
                "state_bytes": optimizer_state_bytes(zero_opt),
                "ref_state_bytes": optimizer_state_bytes(ref_opt),
                "largest_param_state_bytes": 2 * max(p.numel() * p.element_size() for p in zero_model.parameters()),
                "checksum": float(sum(p.double().sum() for p in zero_model.parameters())),
                "zero_norms": zero_opt.grad_norms,
                "ref_norms": ref_opt.grad_norms,
            }
        )
    return out


class TiedLM(nn.Module):
    """Embedding tied to the output head; ``shared`` runs twice; ``late`` is registered first, runs last."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.late = nn.Linear(8, 8)
        self.embed = nn.Embedding(16, 8)
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.shared(self.shared(self.embed(idx)).tanh()).tanh()
        return self.head(self.late(h))
