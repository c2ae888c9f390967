"""Route a model's parameters to Muon or AdamW the way Megatron and the Muon authors do.

Muon orthogonalises *hidden* matrices; everything else is stepped elementwise (AdamW):

* 2-D weights of hidden layers (attention, MLP) → Muon;
* embeddings (every ``nn.Embedding`` parameter), the output head — tied to the
  embedding (then it *is* the embedding's tensor) or not (a 2-D weight whose name
  matches ``head`` or whose shape equals an embedding table's) — norms, biases and
  any parameter that is not 2-D → AdamW;
* name globs override both: ``to_muon`` forces Muon, ``to_adamw`` forces AdamW
  (``to_adamw`` wins when both match); a non-2-D parameter is never sent to Muon.

The result is two param groups, Muon's naming its class (``"optimizer_class"``), for
:class:`~zero_lab.optimizer.ZeroRedundancyOptimizer` or
:class:`~zero_lab.chained.ChainedOptimizer` with ``torch.optim.AdamW`` as the default::

    groups = muon_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 3e-4})
    opt = ZeroRedundancyOptimizer(groups, torch.optim.AdamW, partitioner=SortedGreedy(cost="newton_schulz"))
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from zero_lab.chained import GROUP_CLASS_KEY

__all__ = ["HEAD_PATTERNS", "muon_param_groups", "never_to_muon", "route_to_muon"]

#: Names that mark an output head (matched with ``fnmatch`` against full parameter names).
HEAD_PATTERNS: tuple[str, ...] = ("head.*", "*.head.*", "lm_head.*", "*.lm_head.*", "output.*", "*.output_layer.*")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def route_to_muon(
    model: nn.Module,
    to_muon: Sequence[str] = (),
    to_adamw: Sequence[str] = (),
    head: Sequence[str] = HEAD_PATTERNS,
) -> dict[str, bool]:
    """``{parameter name: goes to Muon}`` for every parameter of ``model`` (tied ones once,
    under their first name); see the module docstring for the rules."""
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    table_shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Embedding)}
    routes = {}
    for name, param in model.named_parameters():
        hidden_matrix = (
            param.dim() == 2
            and id(param) not in embedding_ids
            and not _matches(name, head)
            and tuple(param.shape) not in table_shapes
        )
        if param.dim() == 2 and _matches(name, to_muon):
            hidden_matrix = True
        if _matches(name, to_adamw):
            hidden_matrix = False
        routes[name] = hidden_matrix
    return routes


def never_to_muon(model: nn.Module, to_muon: Sequence[str]) -> dict[str, list[str]]:
    """``{glob: [names]}``: the parameters each ``to_muon`` glob matches that are not 2-D, which
    :func:`route_to_muon` never sends to Muon (they stay elementwise); globs without such a match are left out."""
    out: dict[str, list[str]] = {}
    for name, param in model.named_parameters():
        if param.dim() != 2:
            for pattern in to_muon:
                if fnmatch.fnmatchcase(name, pattern):
                    out.setdefault(pattern, []).append(name)
    return out


def muon_param_groups(
    model: nn.Module,
    muon: Mapping[str, Any] | None = None,
    adamw: Mapping[str, Any] | None = None,
    muon_class: type[torch.optim.Optimizer] = torch.optim.Muon,
    to_muon: Sequence[str] = (),
    to_adamw: Sequence[str] = (),
    head: Sequence[str] = HEAD_PATTERNS,
    named: bool = True,
) -> list[dict[str, Any]]:
    """Two param groups: ``muon_class`` (with ``muon`` arguments) for hidden matrices, and the
    rest with ``adamw`` arguments and no class of its own (the optimizer's default class).

    ``named``: groups hold ``(name, parameter)`` pairs (names for ``Manual`` and
    checkpoints); empty groups are left out.
    """
    routes = route_to_muon(model, to_muon, to_adamw, head)
    pairs = list(model.named_parameters())
    matrices = [(n, p) for n, p in pairs if routes[n]]
    others = [(n, p) for n, p in pairs if not routes[n]]
    groups = []
    if matrices:
        groups.append(
            {"params": matrices if named else [p for _, p in matrices], GROUP_CLASS_KEY: muon_class, **(muon or {})}
        )
    if others:
        groups.append({"params": others if named else [p for _, p in others], **(adamw or {})})
    return groups
