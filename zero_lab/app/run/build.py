"""Build what a rank trains — model, DDP wrapper, optimizer — in the order they must be made.

One function, :func:`build_training`, owns the order, because the overlap mode ties the
three together (the optimizer steps inside DDP's communication hook):

1. the model, seeded alike on every rank, built in fp32 and cast to ``param_dtype`` (every dtype
   starts from the same weights), wrapped in DDP with DDP's own options from ``dist.``;
2. the optimizer from ``cfg.optim`` (a ``_partial_`` target): plain ``torch.optim`` for the
   baselines; for the zero_* options ``zero_lab.ZeroRedundancyOptimizer`` with the partitioner,
   ``bucket_view``, ``overlap``, ``exchange`` and, where followed (``partitioner=ddp_bucket``,
   overlap), DDP's buckets (:func:`zero_lab.ddp_buckets.ddp_bucket_map`), so its partition is built
   once, along them (``optim.max_grad_norm`` is the loop's: :func:`zero_lab.app.run.step.unscale_and_clip`);
3. with ``grad_reduce=``, the comm hook that reduces each bucket to its owners
   (:func:`zero_lab.grad_reduce.reduce_gradients`; ``release_grads=true`` releases the rest after
   backward), wrapping the ZeRO step hook (``overlap_hook``) with ``overlap=true``; without it,
   ``overlap=true`` puts the step hook on DDP's all-reduce. A plain optimizer takes
   ``grad_reduce=all_reduce`` only: DDP's traffic, metered;
4. with ``prefetch=true``, :func:`zero_lab.overlap.prefetch_exchange`: the step only issues the
   exchange, the next forward waits per module.

The LR scheduler, fp16's ``GradScaler`` and ``compile=true``'s ``torch.compile`` of the DDP wrapper
come last. ``dp=zero_lab`` wraps the model in the engine (:class:`zero_lab.ShardedDataParallel`) instead, and
so does ``dp=auto`` (the default) for a ``zero_*`` optimizer (:func:`zero_lab.app.plan.data_parallel.resolve_dp`).

    training = build_training(cfg, torch.device("cpu"))
    loss = data.loss(training.ddp(x), y); loss.backward(); training.optimizer.step()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from zero_lab import overlap
from zero_lab.app.config.registered import exchange_name, grad_reduce_name
from zero_lab.app.config.schema import APP_KEYS, PARAM_DTYPES, enum_str
from zero_lab.app.plan.data_parallel import DpChoice, engine_options, resolve_dp
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.run_plan import param_groups, shard_size_of
from zero_lab.app.run.training import Training
from zero_lab.chained import GROUP_CLASS_KEY, ChainedOptimizer
from zero_lab.ddp_buckets import ddp_bucket_map
from zero_lab.engine import ShardedDataParallel
from zero_lab.grad_reduce import reduce_gradients
from zero_lab.partition import WithoutGradients, bucket_use

__all__ = ["build_training", "make_ddp", "make_scheduler", "optimizer_factory", "params_never_reached"]


log = logging.getLogger(__name__)


def params_never_reached(planned: Sequence[str] | None) -> list[str]:
    """Rank 0's ``planned`` names (:attr:`~zero_lab.app.plan.run_plan.RunPlan.never_reached`) on every
    rank — under torchrun or srun every rank planned its own job — so every rank partitions alike; ``[]``
    for ``None`` (nothing applies: a config fact, alike on every rank). Collective otherwise."""
    if planned is None:
        return []
    found = [list(planned) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)  # bounded by the group's timeout
    names = found[0] or []
    if names:
        log.info("parameters without gradients, priced at nothing when partitioning: %s", ", ".join(names))
    return names


def build_training(
    cfg: DictConfig, device: torch.device, plan: OptimPlan | None = None, without_grad: Sequence[str] = ()
) -> Training:
    """Model -> DDP -> optimizer (-> overlap hook); see the module docstring for why. ``plan``: the
    job's :class:`~zero_lab.app.plan.optim_plan.OptimPlan` (made from ``cfg.optim`` when not given).
    ``without_grad``: names of parameters that never get a gradient
    (:func:`params_never_reached`), which the partitioner prices at nothing."""
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model)
    if cfg.dist.get("sync_batchnorm"):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device=device, dtype=PARAM_DTYPES[enum_str(cfg.param_dtype)])
    plan = plan or OptimPlan.of(cfg.optim)
    choice = resolve_dp(cfg, plan)  # dp=auto: the engine for a zero_* optimizer unless a key needs DDP
    if choice.dp == "zero_lab":
        return _engine_training(cfg, model, plan, without_grad, choice)
    ddp = make_ddp(model, cfg.dist, device)
    strategy = plan.strategy  # plain DDP, or ZeRO with its partitioner and hooks
    make_optimizer = optimizer_factory(cfg.optim)
    groups = param_groups(cfg.optim, model)
    if strategy.shards_state:
        partitioner = _partitioner(cfg, without_grad)
        # DDP's buckets, modelled with its real caps (no hook needed): for the overlap hooks, and for a
        # partitioner that follows them (partitioner=ddp_bucket) with or without overlap
        follows = cfg.overlap or bucket_use(getattr(partitioner, "inner", partitioner)).needs_ddp_buckets
        optimizer = make_optimizer(
            groups if groups is not None else model.named_parameters(),
            partitioner=partitioner,
            parameters_as_bucket_view=cfg.bucket_view,
            overlap_with_ddp=cfg.overlap,
            exchange=exchange_name(cfg.exchange),
            ddp_buckets=ddp_bucket_map(ddp) if follows else None,
            shard_size=shard_size_of(cfg),
        )
    else:
        optimizer = make_optimizer(groups if groups is not None else model.parameters())
    reduce = grad_reduce_name(cfg.get("grad_reduce"))  # with overlap, its comm hook wraps the step hook
    release_grads = bool(cfg.get("release_grads", False))
    reducer = reduce_gradients(ddp, optimizer, reduce, release_grads, _step_hook(cfg)) if reduce is not None else None
    if strategy.shards_state and cfg.overlap and reducer is None:
        shard_buckets = bucket_use(optimizer.partitioner).shard_buckets
        ddp.register_comm_hook(None, _step_hook(cfg)(allreduce_hook, ddp, optimizer, shard_buckets=shard_buckets))
    if strategy.shards_state and cfg.prefetch:
        overlap.prefetch_exchange(model, optimizer)  # lives as long as the model's hooks
    return Training(
        model=model,
        # compile=true: Dynamo's DDP optimizer cuts the graph at DDP's bucket boundaries, so the all-reduces
        # still overlap backward; the compiled module forwards no_sync and every other attribute to DDP
        ddp=torch.compile(ddp) if cfg.get("compile") else ddp,
        optimizer=optimizer,
        zero=strategy.shards_state,
        exchange_stats=optimizer.comm_stats if strategy.shards_state else None,  # with overlap: metered by the hook
        grad_reducer=reducer,
        grad_stats=reducer.stats if reducer is not None else None,
        max_grad_norm=cfg.optim.get("max_grad_norm"),
        scheduler=make_scheduler(cfg, optimizer),
        scaler=torch.amp.GradScaler(device.type) if enum_str(cfg.get("autocast")) == "fp16" else None,
        dp_choice=choice,
    )


def _engine_training(
    cfg: DictConfig, model: nn.Module, plan: OptimPlan, without_grad: Sequence[str], choice: DpChoice
) -> Training:
    """``dp=zero_lab`` (or ``auto`` resolved to it): the class that steps the state (``optim=zero_adam`` and
    ``optim=adam`` alike: Adam) over the model, wrapped by :class:`zero_lab.ShardedDataParallel`, which
    re-points it at this rank's ranges; ``prefetch``, ``exchange`` and ``grad_reduce`` pick its modes
    (``auto`` / null: its defaults), ``dist.broadcast_buffers`` is DDP's."""
    options, foreign = engine_options(cfg.optim, plan)
    if foreign:
        raise ValueError(
            f"dp=zero_lab: optim.{foreign[0]} is not an argument of {plan.name}; the engine takes the class's own"
        )
    kwargs = OmegaConf.to_container(OmegaConf.create(options))
    groups = param_groups(cfg.optim, model)  # optim=zero_muon: hidden matrices to Muon (stepped whole by their owners)
    if groups is not None and any(GROUP_CLASS_KEY in group for group in groups):
        optimizer: Any = ChainedOptimizer(groups, plan.optimizer_class, **kwargs)
    else:
        optimizer = plan.optimizer_class(groups if groups is not None else model.parameters(), **kwargs)
    engine = ShardedDataParallel(
        model,
        optimizer,
        partitioner=_partitioner(cfg, without_grad),
        grad_reduce=_unless_auto(grad_reduce_name(cfg.get("grad_reduce"))),
        exchange=_unless_auto(exchange_name(cfg.exchange)),
        prefetch=bool(cfg.prefetch),
        shard_size=shard_size_of(cfg),
        broadcast_buffers=bool(cfg.dist.get("broadcast_buffers", True)),
    )
    return Training(
        model=model,
        ddp=engine,  # type: ignore[arg-type]  # the loop calls forward and no_sync, which both have
        optimizer=optimizer,
        zero=True,
        dp_choice=choice,
        exchange_stats=engine.param_comm.stats,
        grad_stats=engine.comm.stats,  # its bucket reductions (and replica all-reduces)
        max_grad_norm=cfg.optim.get("max_grad_norm"),
        scheduler=make_scheduler(cfg, optimizer),
    )


def _unless_auto(name: str | None) -> str | None:
    """A mode the engine takes as given; ``auto`` (and ``None``) leave it to the engine's per-backend default."""
    return None if name == "auto" else name


def make_scheduler(cfg: DictConfig, optimizer: Optimizer) -> LRScheduler | None:
    """``scheduler=<option>``: torch's scheduler from its ``_target_`` (a partial taking the
    optimizer), after ``scheduler.warmup_steps`` of torch's ``LinearLR`` warmup from
    ``1/(warmup_steps+1)`` of each group's lr, chained with ``SequentialLR``. Each param
    group's own lr is scaled, so per-group LRs keep their ratios. ``None`` without a scheduler."""
    node = cfg.get("scheduler")
    if node is None or node.get("_target_") is None:  # scheduler=none
        return None
    kept = OmegaConf.create({k: v for k, v in node.items() if k not in APP_KEYS["scheduler"]})
    warmup = int(node.get("warmup_steps", 0))
    if not warmup:
        return instantiate(kept)(optimizer)
    ramp = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / (warmup + 1), total_iters=warmup)
    main = instantiate(kept)(optimizer)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [ramp, main], milestones=[warmup])


def make_ddp(model: nn.Module, dist_cfg: DictConfig, device: torch.device) -> DDP:
    """DDP with the ``dist.`` keys that are DDP's own arguments (bucket size and the four options)."""
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=dist_cfg.bucket_cap_mb,
        find_unused_parameters=bool(dist_cfg.get("find_unused_parameters", False)),
        static_graph=bool(dist_cfg.get("static_graph", False)),
        # passed only when off: torch 2.13 warns that the argument is deprecated, and its
        # replacement (forward_sync_buffers) still syncs buffers at init, which false must not
        **({} if dist_cfg.get("broadcast_buffers", True) else {"broadcast_buffers": False}),
    )


def optimizer_factory(optim_cfg: DictConfig) -> Any:
    """``cfg.optim`` as a partial ``(params, **kwargs) -> Optimizer``, without the loop's keys."""
    kept = OmegaConf.create({k: v for k, v in optim_cfg.items() if k not in APP_KEYS["optim"]})
    return instantiate(kept)


def _partitioner(cfg: DictConfig, without_grad: Sequence[str]) -> Any:
    """``partitioner=``, wrapped in :class:`~zero_lab.partition.WithoutGradients` when some never get a gradient."""
    partitioner = instantiate(cfg.partitioner)
    return WithoutGradients(partitioner, without_grad) if without_grad else partitioner


def _step_hook(cfg: DictConfig) -> Callable[..., Any]:
    """``overlap_hook=``: which of :mod:`zero_lab.overlap`'s hooks steps the optimizer inside DDP's communication."""
    interleaved = enum_str(cfg.overlap_hook) == "interleaved"
    return overlap.hook_with_zero_step_interleaved if interleaved else overlap.hook_with_zero_step
