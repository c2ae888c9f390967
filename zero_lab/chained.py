"""Several ``torch.optim`` classes behind one optimizer: each param group names its class.

Matrix optimizers step only some parameters (``torch.optim.Muon`` refuses anything but
2-D matrices), so a real model is trained by a *chain*: Muon for the hidden matrices,
AdamW for embeddings, the head, norms and biases. A param group names its class under
the key ``"optimizer_class"`` (the class itself, or its dotted path); every other key is
that class's argument; groups without the key use the default class and its ``**defaults``::

    opt = ChainedOptimizer(
        [{"params": matrices, "optimizer_class": torch.optim.Muon, "lr": 0.02}, {"params": others}],
        torch.optim.AdamW, lr=3e-4, weight_decay=0.1,
    )

Algorithm: one inner optimizer per class, created at its first group (with the default
class's ``**defaults``, or, for another class, only the arguments it requires, so its own
defaults fill the rest, as ``cls(groups)`` would); a group goes to its class's inner
optimizer, which fills the group's defaults. :attr:`param_groups` are the inner
optimizers' own group dicts in the order given, so LR schedulers and hyperparameter
edits reach them; ``state`` is a read-only view of the inner states. ``step`` runs the
closure once, then steps each inner optimizer; the arithmetic is exactly that of the
plain optimizers stepped one after another. ``state_dict`` numbers parameters across the
groups in order (torch's format) and names each group's class as a dotted path;
:func:`split_state_dict` cuts it into one plain state dict per class (loadable by
``torch.optim.Muon`` etc. built on the same groups in order) and :func:`merge_state_dicts`
puts them back together.

:class:`~zero_lab.optimizer.ZeroRedundancyOptimizer` builds its local optimizer as one
of these, so the same groups shard with one local optimizer per class on every rank.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from zero_lab.state_probe import group_defaults, required_args

__all__ = [
    "GROUP_CLASS_KEY",
    "NOT_HYPERPARAMETERS",
    "ChainedOptimizer",
    "canonical_class_path",
    "class_defaults",
    "class_path",
    "group_class",
    "merge_state_dicts",
    "resolve_class",
    "split_state_dict",
]

#: The param-group key naming the class that steps the group; the same word names the default class
#: (``ZeroRedundancyOptimizer(params, optimizer_class)``, the app's ``optim.optimizer_class``).
GROUP_CLASS_KEY = "optimizer_class"


def class_path(cls: type) -> str:
    """The one spelling of an optimizer class in files (state dicts, manifests, app checkpoints):
    ``torch.optim.adamw.AdamW`` → ``"torch.optim.AdamW"`` where the short path resolves to it,
    else ``module.QualName``."""
    short = f"{cls.__module__.split('.')[0]}.optim.{cls.__name__}" if cls.__module__.startswith("torch.optim") else ""
    if short and getattr(torch.optim, cls.__name__, None) is cls:
        return short
    return f"{cls.__module__}.{cls.__qualname__}"


def canonical_class_path(value: Any) -> Any:
    """A class or its saved dotted path in :func:`class_path`'s spelling; what was written another way
    (manifests before this spelling was the only one held ``torch.optim.adam.Adam``) reads the same.
    A path that no longer imports, or any other value, is returned as it is."""
    if isinstance(value, type):
        return class_path(value)
    if not isinstance(value, str):
        return value
    try:
        return class_path(resolve_class(value))
    except (TypeError, ValueError):
        return value


def resolve_class(value: Any, where: str = GROUP_CLASS_KEY) -> type[Optimizer]:
    """A ``torch.optim.Optimizer`` subclass from itself or its dotted path; errors name ``where``."""
    cls = value
    if isinstance(value, str):
        module, _, name = value.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            raise ValueError(f"{where}={value!r}: no such class; give a dotted path like 'torch.optim.Muon'") from None
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise TypeError(f"{where} must be a torch.optim.Optimizer subclass (or its dotted path), got {value!r}")
    return cls


def group_class(group: Mapping[str, Any], default: type[Optimizer]) -> type[Optimizer]:
    """The class that steps ``group``: its ``"optimizer_class"`` key, else ``default``."""
    value = group.get(GROUP_CLASS_KEY)
    return default if value is None else resolve_class(value)


#: Param-group keys that are not hyperparameters of the class that steps the group.
NOT_HYPERPARAMETERS = ("params", "param_names", GROUP_CLASS_KEY)


def _hyper(group: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in NOT_HYPERPARAMETERS}


def check_group_classes(groups: Sequence[Mapping[str, Any]], classes: Sequence[type[Optimizer]], what: str) -> None:
    """Raise ``ValueError`` when a saved group names a class other than the one stepping it here."""
    for index, (saved, cls) in enumerate(zip(groups, classes)):
        named = saved.get(GROUP_CLASS_KEY)
        if named is not None and resolve_class(named) is not cls:
            raise ValueError(
                f"{what} {index} was saved for {named} but is stepped by {class_path(cls)} here; "
                "build the optimizer with the same optimizer_class per group"
            )


def class_defaults(cls: type[Optimizer], group: Mapping[str, Any]) -> dict[str, Any]:
    """Every hyperparameter ``cls`` would give ``group``: the group's own keys, then the class's
    defaults (:func:`zero_lab.state_probe.group_defaults`, on a ``meta`` tensor of the group's
    first parameter's shape, so a class that checks shapes checks the real one)."""
    params = [p[1] if isinstance(p, tuple) else p for p in group.get("params", [])]
    shape, dtype = (tuple(params[0].shape), params[0].dtype) if params else ((2, 2), torch.float32)
    return _hyper(group_defaults(cls, _hyper(group), shape, dtype))


class _StateView(Mapping):
    """``param -> state`` over every inner optimizer's ``state`` (read-only, live)."""

    def __init__(self, chained: ChainedOptimizer):
        self._chained = chained

    def __getitem__(self, key: Any) -> Any:
        for optimizer in self._chained.optimizers:
            if key in optimizer.state:
                return optimizer.state[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        for optimizer in self._chained.optimizers:
            yield from optimizer.state

    def __len__(self) -> int:
        return sum(len(optimizer.state) for optimizer in self._chained.optimizers)


class ChainedOptimizer(Optimizer):
    """One optimizer over param groups that each name their own ``torch.optim`` class.

    Args:
        params: tensors, ``named_parameters()`` pairs, or param-group dicts; a group's
            ``"optimizer_class"`` (class or dotted path) picks its class.
        optimizer_class: the class of groups that name none; ``**defaults`` go to it.

    ``optimizers`` lists the inner optimizers (one per class, in order of first use) and
    ``classes`` their classes; see the module docstring for the algorithm.
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[Optimizer], **defaults: Any):
        self.optimizer_class = resolve_class(optimizer_class, GROUP_CLASS_KEY)
        self.optimizers: list[Optimizer] = []
        self.classes: list[type[Optimizer]] = []
        self._routes: list[tuple[int, int]] = []  # global group -> (inner optimizer, its group)
        super().__init__(params, defaults)
        self.state = _StateView(self)  # type: ignore[assignment]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Route ``param_group`` to the inner optimizer of its class (creating it at first use)."""
        group = dict(param_group)
        cls = group_class(group, self.optimizer_class)
        group.pop(GROUP_CLASS_KEY, None)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        tensors = [group["params"]] if isinstance(group["params"], torch.Tensor) else list(group["params"])
        if any(id(p[1] if isinstance(p, tuple) else p) in seen for p in tensors):
            raise ValueError("some parameters appear in more than one parameter group")
        if cls in self.classes:
            inner = self.classes.index(cls)
            self.optimizers[inner].add_param_group(group)
        else:
            kwargs = self.defaults if cls is self.optimizer_class else required_args(cls, group)
            self.optimizers.append(cls([group], **kwargs))
            self.classes.append(cls)
            inner = len(self.optimizers) - 1
        self._routes.append((inner, len(self.optimizers[inner].param_groups) - 1))
        self.param_groups.append(self.optimizers[inner].param_groups[-1])

    def group_classes(self) -> list[type[Optimizer]]:
        """The class of each param group, in order."""
        return [self.classes[inner] for inner, _ in self._routes]

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Run ``closure`` once (with grad enabled), then step every inner optimizer in order;
        return the closure's loss, else the first non-``None`` result of an inner ``step``
        (one class: what its ``step`` returned, as torch's class returns the local step's).

        A ``closure`` that is not callable is no closure this class can run: it goes to every
        inner optimizer's ``step`` as it came (``closure=closure``), as torch's
        ``ZeroRedundancyOptimizer`` passes any closure to its local optimizer."""
        if closure is not None and not callable(closure):
            results = [optimizer.step(closure=closure, **kwargs) for optimizer in self.optimizers]
            return next((result for result in results if result is not None), None)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        results = [optimizer.step(**kwargs) for optimizer in self.optimizers]
        return loss if loss is not None else next((result for result in results if result is not None), None)

    def state_dict(self) -> dict[str, Any]:
        """torch's format over the groups in order; every group names its class (dotted path)."""
        packed = super().state_dict()
        for group, cls in zip(packed["param_groups"], self.group_classes()):
            group[GROUP_CLASS_KEY] = class_path(cls)
        return packed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this chain (from :meth:`state_dict`, or a ZeRO consolidation
        of the same groups); each inner optimizer loads its groups' part."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"state_dict has {len(groups)} param groups but this optimizer has {len(self.param_groups)}; "
                "load a state saved from the same groups"
            )
        check_group_classes(groups, self.group_classes(), "param group")
        parts = _split(state_dict, [inner for inner, _ in self._routes], len(self.optimizers))
        for optimizer, part in zip(self.optimizers, parts):
            optimizer.load_state_dict(part)
        self.param_groups[:] = [self.optimizers[inner].param_groups[j] for inner, j in self._routes]


def _split(state_dict: dict[str, Any], owner_of_group: Sequence[int], parts: int) -> list[dict[str, Any]]:
    """Cut a state dict into ``parts`` plain ones; group g goes to part ``owner_of_group[g]``."""
    out: list[dict[str, Any]] = [{"state": {}, "param_groups": []} for _ in range(parts)]
    for group, part in zip(state_dict["param_groups"], owner_of_group):
        target = out[part]
        first = sum(len(g["params"]) for g in target["param_groups"])
        plain = {k: v for k, v in group.items() if k != GROUP_CLASS_KEY}
        plain["params"] = list(range(first, first + len(group["params"])))
        for new, saved in zip(plain["params"], group["params"]):
            if saved in state_dict["state"]:
                target["state"][new] = state_dict["state"][saved]
        target["param_groups"].append(plain)
    return out


def split_state_dict(state_dict: dict[str, Any], default_class: Any = None) -> list[dict[str, Any]]:
    """One plain state dict per class, classes in order of first use among the groups.

    ``state_dict`` is a chained one (every group names its class) — from
    :class:`ChainedOptimizer` or a multi-class ZeRO's ``consolidate_state_dict`` +
    ``state_dict`` — or names some (the rest are ``default_class``). Part k loads into
    ``cls_k(groups of cls_k, in order)``, e.g. torch's own ``Muon`` and ``AdamW``::

        for plain, part in zip((muon, adamw), split_state_dict(zero.state_dict())):
            plain.load_state_dict(part)
    """
    names = []
    for index, group in enumerate(state_dict["param_groups"]):
        named = group.get(GROUP_CLASS_KEY, default_class)
        if named is None:
            raise ValueError(f"param group {index} names no optimizer_class: pass default_class=")
        names.append(class_path(resolve_class(named)))
    order = list(dict.fromkeys(names))
    return _split(state_dict, [order.index(n) for n in names], len(order))


def merge_state_dicts(state_dicts: Sequence[dict[str, Any]], group_classes: Sequence[Any]) -> dict[str, Any]:
    """The inverse of :func:`split_state_dict`: plain state dicts (one per class, classes in
    order of first use in ``group_classes``) → one chained state dict over the groups in order.

    ``group_classes`` is each group's class (or dotted path), e.g. ``opt.group_classes()``.
    """
    names = [class_path(resolve_class(c)) for c in group_classes]
    order = list(dict.fromkeys(names))
    if len(state_dicts) != len(order):
        raise ValueError(
            f"got {len(state_dicts)} state dicts for {len(order)} classes ({', '.join(order)}): give one per class, "
            "in order of first use"
        )
    taken = [0] * len(order)
    state: dict[int, Any] = {}
    groups: list[dict[str, Any]] = []
    offset = 0
    for name in names:
        part = order.index(name)
        source = state_dicts[part]
        if taken[part] >= len(source["param_groups"]):
            raise ValueError(f"the state dict for {name} has fewer param groups than the groups stepped by it")
        saved = source["param_groups"][taken[part]]
        taken[part] += 1
        group = dict(saved) | {GROUP_CLASS_KEY: name, "params": list(range(offset, offset + len(saved["params"])))}
        for new, key in zip(group["params"], saved["params"]):
            if key in source["state"]:
                state[new] = source["state"][key]
        offset += len(saved["params"])
        groups.append(group)
    for part, name in enumerate(order):
        if taken[part] != len(state_dicts[part]["param_groups"]):
            raise ValueError(f"the state dict for {name} has more param groups than the groups stepped by it")
    return {"state": state, "param_groups": groups}
