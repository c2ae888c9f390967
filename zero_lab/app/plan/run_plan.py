"""The run's plan: what a composed config implies, computed once per job on one meta model.

:meth:`RunPlan.of` looks the optimizer up (:class:`~zero_lab.app.plan.optim_plan.OptimPlan`) and
builds, each once, the model on the ``meta`` device in ``param_dtype`` (shapes, no memory), its
``optim.param_groups``, the partitioner (ZeRO) and the data source. From those it answers, each
once: :attr:`~RunPlan.specs` (one :class:`~zero_lab.partition.ParamSpec` per parameter in the
optimizer's order, routed to the class that steps it and, where the partition follows DDP's
buckets, in the bucket it lands in: the app's one place that builds specs, and what the ranks
price "÷ DDP" from), :meth:`~RunPlan.partition`, the per-rank :meth:`~RunPlan.memory` (each
group priced by the class that steps it, so memory and partition agree), and the
:attr:`~RunPlan.probe` of rank 0's first batch. What could not be built is kept with its error
(:class:`~zero_lab.app.workloads.user_code.Attempt`): the check that owns it reports it, every
other reader skips it.

    plan = RunPlan.of(cfg)
    plan.specs[0].name, plan.partition().report().imbalance, plan.memory().ranks[0].total_bytes
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any

import torch
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig

from zero_lab.app.config.schema import PARAM_DTYPES, enum_str
from zero_lab.app.config.targets import build
from zero_lab.app.plan.data_parallel import DpChoice, resolve_dp
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.strategy import Strategy
from zero_lab.app.workloads.protocols import OUTPUT_KEY, MetaProbe, probe_on_meta
from zero_lab.app.workloads.user_code import Attempt, attempt
from zero_lab.comm import ranks_per_node
from zero_lab.ddp_buckets import DdpBuckets
from zero_lab.elementwise import is_elementwise
from zero_lab.hierarchy import NODE, resolve_shard_size
from zero_lab.partition import ParamSpec, Partition, Partitioner, bucket_use
from zero_lab.planner import MemoryPlan, plan_memory

__all__ = ["RunPlan", "param_groups"]


def param_groups(optim_cfg: DictConfig, model: torch.nn.Module) -> list[dict[str, Any]] | None:
    """``optim.param_groups`` (a ``_partial_`` target ``model -> param groups``: ``zero_lab.muon_param_groups``)
    applied to ``model``; ``None`` when unset (every parameter in one group)."""
    node = optim_cfg.get("param_groups")
    return None if node is None else instantiate(node)(model)


class RunPlan:
    """One job's plan (module docstring); each part is computed on first use and kept."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    @classmethod
    def of(cls, cfg: DictConfig) -> RunPlan:
        """The plan of ``cfg`` (a composed job config whose ``_target_``s were checked)."""
        return cls(cfg)

    @cached_property
    def _optim(self) -> tuple[OptimPlan | None, str | None]:
        """``(None, problem)`` when a class ``cfg.optim`` names cannot be looked up, ``(None, None)``
        when its ``_target_`` cannot be imported (the arguments check names that)."""
        try:
            get_object(str(self.cfg.optim.get("_target_")))
        except ImportError:
            return None, None
        try:
            return OptimPlan.of(self.cfg.optim), None
        except (ImportError, ValueError) as error:
            return None, f"optim: {error}"

    @property
    def optim(self) -> OptimPlan | None:
        """What ``cfg.optim`` builds: ZeRO or not, which class steps (``None``: cannot be looked up)."""
        return self._optim[0]

    @property
    def optim_problem(self) -> str | None:
        """Why ``cfg.optim`` cannot be looked up, as a problem line (``None``: it can, or is unimportable)."""
        return self._optim[1]

    @cached_property
    def dp(self) -> DpChoice:
        """The data-parallel path that trains (``dp=auto`` resolved by
        :func:`~zero_lab.app.plan.data_parallel.resolve_dp`)."""
        return resolve_dp(self.cfg, self.optim)

    @cached_property
    def model(self) -> Attempt[torch.nn.Module]:
        """The model on the ``meta`` device in ``param_dtype``: built once, for every reader."""
        return attempt(lambda: _meta_model(self.cfg))

    @cached_property
    def groups(self) -> Attempt[list[dict[str, Any]] | None]:
        """``optim.param_groups`` applied to the meta model (value ``None``: unset, or no model)."""
        model = self.model.value
        return attempt(lambda: param_groups(self.cfg.optim, model)) if model is not None else Attempt()

    @cached_property
    def partitioner(self) -> Attempt[Partitioner]:
        """The configured partitioner, built once (ZeRO only: a plain optimizer partitions nothing)."""
        if self.optim is None or not self.optim.strategy.shards_state:
            return Attempt()
        return attempt(lambda: build(self.cfg.partitioner, "partitioner"))

    @property
    def _follows_ddp_buckets(self) -> bool:
        """The specs carry DDP's buckets: with the overlap hooks, and on the DDP path for a partitioner
        that follows them (``ddp_bucket``; the engine follows its own buckets)."""
        if self.cfg.overlap:
            return True
        partitioner = self.partitioner.value
        engine = self.dp.dp == "zero_lab"
        return partitioner is not None and not engine and bucket_use(partitioner).needs_ddp_buckets

    @cached_property
    def data(self) -> Attempt[Any]:
        """The data source, built once (its constructor's checks run: a missing corpus)."""
        return attempt(lambda: build(self.cfg.data, "data"))

    def release_data(self) -> None:
        """Let go of the data source (a kept plan needs only what it answered: :attr:`never_reached`, answered
        first); built again if asked for."""
        _ = self.never_reached
        self.__dict__.pop("data", None)

    @property
    def strategy(self) -> Strategy | None:
        """Plain DDP or ZeRO (``None`` when the optimizer cannot be looked up)."""
        return self.optim.strategy if self.optim is not None else None

    @property
    def world_size(self) -> int:
        return int(self.cfg.dist.world_size)

    @property
    def shard_size(self) -> int:
        """The ranks the optimizer state is partitioned over: ``dist.shard_size`` (:func:`shard_size_of`),
        else ``dist.world_size`` (also when it is refused: the checks report that)."""
        try:
            return shard_size_of(self.cfg) or self.world_size
        except ValueError:
            return self.world_size

    @cached_property
    def classes(self) -> list[type] | None:
        """The class that steps each param group, in order (``None``: one group, ``optim``'s class)."""
        if self.optim is None or self.groups.value is None:
            return None
        return self.optim.group_classes(self.groups.value)

    @cached_property
    def specs(self) -> list[ParamSpec] | None:
        """The specs the optimizer will partition (module docstring); ``None`` without a model."""
        model = self.model.value
        if model is None:
            return None
        device = torch.device(enum_str(self.cfg.dist.device))
        groups, classes = self.groups.value, self.classes
        if groups is None or classes is None:
            specs = [ParamSpec.of(p, name=name, device=device) for name, p in model.named_parameters()]
        else:
            specs = [
                ParamSpec.of(
                    param,
                    name=name,
                    group=index,
                    device=device,
                    elementwise=is_elementwise(classes[index]),
                    stepper=classes[index].__name__,
                )
                for index, group in enumerate(groups)
                for name, param in (p if isinstance(p, tuple) else (None, p) for p in group["params"])
            ]
        if self._follows_ddp_buckets:  # the optimizer partitions along the buckets DDP will make
            sizes = [s.nbytes for s in specs if s.trainable]
            buckets = iter(DdpBuckets.from_bucket_cap_mb(self.cfg.dist.bucket_cap_mb).assign(sizes))
            specs = [replace(s, bucket=next(buckets)) if s.trainable else s for s in specs]
        return specs

    @cached_property
    def probe(self) -> MetaProbe | None:
        """Rank 0's first batch through the meta model, the loss and backward (the model is left as it
        was); ``None`` without a model or data (their checks report why)."""
        model, data = self.model.value, self.data.value
        if model is None or data is None:
            return None
        dtype = PARAM_DTYPES[enum_str(self.cfg.param_dtype)]
        output_key = str(self.cfg.get("output_key", OUTPUT_KEY))
        return probe_on_meta(model, data, max(self.world_size, 1), output_key, dtype)

    @cached_property
    def never_reached(self) -> tuple[str, ...] | None:
        """The trainable parameters rank 0's first batch leaves without a gradient (:attr:`probe`, before
        the first step: a resume loads state into the partition; empty when the meta device cannot run
        the model). They never get optimizer state, so the ranks' partitioner prices them at nothing
        (:class:`zero_lab.partition.WithoutGradients`); one only a later batch leaves unused is still
        stepped, only less balanced. ``None`` where that does not apply: a plain optimizer,
        ``overlap=true`` (the shards are bound to DDP's hook first), or DDP that allows no unused parameter."""
        unused_allowed = bool(self.cfg.dist.get("find_unused_parameters") or self.cfg.dist.get("static_graph"))
        if self.strategy is None or not self.strategy.shards_state or not unused_allowed or self.cfg.get("overlap"):
            return None
        return tuple(self.probe.unused or ()) if self.probe is not None else ()

    def partition(self, partitioner: Partitioner | None = None, world_size: int | None = None) -> Partition:
        """The partition of :attr:`specs` by ``partitioner`` (the configured one) at ``world_size``
        (:attr:`shard_size`); raises ``ValueError`` when the partitioner refuses them."""
        chosen = partitioner if partitioner is not None else self.partitioner.value
        if chosen is None or self.specs is None:
            raise ValueError("no partition: the model or the partitioner could not be built")
        return chosen(self.specs, world_size or self.shard_size)

    def memory(
        self, partitioner: Partitioner | None = None, world_size: int | None = None, master_weights: bool | None = None
    ) -> MemoryPlan:
        """Every rank's planned memory: :attr:`specs` over ``world_size`` (:attr:`shard_size`), sharded by
        ``partitioner`` (``None``: plain DDP), plus fp32 masters with ``master_weights`` (default:
        ``optim.master_weights``). Raises the model's own error when it could not be built."""
        if self.model.error is not None:
            raise self.model.error
        if self.specs is None or self.optim is None:
            raise ValueError("no memory plan: the optimizer cannot be looked up")
        if master_weights is None:
            master_weights = bool(self.cfg.optim.get("master_weights", False))
        classes = self.classes or [self.optim.optimizer_class]
        per_group = [(c, {}) for c in classes] if len(set(classes)) > 1 else None
        return plan_memory(
            self.specs,
            world_size or self.shard_size,
            partitioner,
            classes[0],
            master_weights=master_weights,
            group_optimizers=per_group,
        )


def shard_size_of(cfg: DictConfig) -> int | None:
    """``dist.shard_size`` in ranks (``None``: unset; ``node``: the launcher's ranks per node, else all, on one
    host); raises ``ValueError`` naming ``dist.shard_size`` for a size that does not divide the world size."""
    size, world = cfg.dist.get("shard_size"), int(cfg.dist.world_size)
    if size is None:
        return None
    if size == NODE and ranks_per_node() is None:
        return world
    return resolve_shard_size(size, world, "dist.shard_size")


def _meta_model(cfg: DictConfig) -> torch.nn.Module:
    """The model built on the meta device in ``param_dtype``: names and sizes, no memory."""
    with torch.device("meta"):
        return build(cfg.model, "model").to(PARAM_DTYPES[enum_str(cfg.param_dtype)])
