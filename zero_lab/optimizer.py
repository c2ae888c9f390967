"""ZeRO stage 1: shard the optimizer state of any ``torch.optim`` optimizer across ranks.

Algorithm, per :meth:`ZeroRedundancyOptimizer.step`:

1. A partitioner (pure, see :mod:`zero_lab.partition`) tiles every parameter's
   elements with shards owned by ranks; every rank computes the same partition.
2. This rank's *local* optimizer (``self.optim``, of the user's class) holds only its
   shards: a whole parameter is handed over as itself, a slice as a 1-D view into the
   parameter's storage whose ``.grad`` is pointed at the same slice of ``param.grad``
   just before the step. State therefore exists only for owned elements (≈ 1/W).
   Param groups may name their own class (``"optimizer_class"``, e.g. Muon beside
   AdamW): the local optimizer is then a :class:`~zero_lab.chained.ChainedOptimizer`
   with one optimizer per class, and the partitioner sees, per parameter, its shape and
   whether its class is elementwise (``ParamSpec``), so it can balance by step cost.
3. The local optimizer steps; shards whose gradient is ``None`` are skipped by every
   ``torch.optim`` optimizer, which is also how a subset is stepped.
4. :class:`~zero_lab.exchange.ParamExchange` brings every rank's updated shards to all
   ranks (broadcasts, point-to-point or all-gathers, ``exchange=``; ``auto`` times the
   in-place ones on the first step's exchange itself, :mod:`zero_lab.auto`), so the replicas
   are identical again. With
   :func:`zero_lab.overlap.prefetch_exchange` the exchange is only issued here and
   the next forward waits for it module by module; every method below that reads
   parameters or optimizer state waits for it first.

With ``overlap_with_ddp=True`` a DDP comm hook (:mod:`zero_lab.overlap`) steps and
exchanges each gradient bucket inside backward instead (``step()`` does nothing).

Partition, local optimizer and exchange are one :class:`~zero_lab.pipeline.StepPipeline`
(reduce gradients -> step owned shards -> exchange parameters), built in the constructor
and never rebuilt; steps 2-4 are :meth:`StepPipeline.step <zero_lab.pipeline.StepPipeline.step>`,
and :meth:`ZeroRedundancyOptimizer.step` keeps only torch's contract around it (the overlap
no-op, waiting for an exchange in flight, Join). A partition that follows DDP's buckets
follows ``ddp_buckets=`` (the app passes :func:`zero_lab.ddp_buckets.ddp_bucket_map`) or,
when none are given, DDP's default caps as :mod:`zero_lab.ddp_buckets` models them over
the parameters; a hook that later brings other buckets keeps the partition (each bucket is
planned from its own parameters) and a warning names the argument that aligns it. Hooks attach phases to the pipeline
(:meth:`StepPipeline.attach_per_bucket <zero_lab.pipeline.StepPipeline.attach_per_bucket>`;
:func:`zero_lab.grad_reduce.reduce_gradients`), they build nothing, and they call the
pipeline, never the optimizer.

Public surface: torch's API (below) and the few names users, checkpoints and the app read:
:attr:`pipeline` (the overlap hooks and prefetch talk to it), :attr:`partition`,
:attr:`partitioner`, :attr:`communicator`, :attr:`comm_stats`, :attr:`all_params`,
:meth:`local_shards`, :meth:`local_shard_states` / :meth:`load_shard_states` (checkpoints),
:meth:`wait_for_exchange` (code reading parameters while prefetching), :meth:`exchange_report`,
:attr:`exchange_mode`, :meth:`clip_grad_norm_`, :meth:`master_weight_bytes`,
:attr:`local_step_seconds`. The names that serve only the overlap hooks and prefetch live on
the pipeline (``opt.pipeline.start_prefetch()``, ...). The partitioner is chosen at construction only
(``partitioner=``).

Drop-in for ``torch.distributed.optim.ZeroRedundancyOptimizer``: same constructor,
``optim``, ``param_groups`` synced both ways, ``state_dict`` in plain optimizer format
(on the consolidation target even without ``consolidate_state_dict``, this rank's shard
elsewhere: the protocol HF Trainer, accelerate and Lightning rely on, docs/clients.md),
``state`` (this rank's shard states), ``load_state_dict`` of a ZeRO or plain state,
``add_param_group``, ``join_hook``. Usage::

    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    ddp(x).sum().backward()
    opt.step()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.optim import Optimizer

from zero_lab.api_checks import check_same_params_on_every_rank, check_state_matches_params, check_target_rank
from zero_lab.bucket_views import reseat
from zero_lab.chained import (
    GROUP_CLASS_KEY,
    NOT_HYPERPARAMETERS,
    ChainedOptimizer,
    check_group_classes,
    class_defaults,
    class_path,
    group_class,
    merge_state_dicts,
)
from zero_lab.collectives import collective_named
from zero_lab.comm import INTER_GROUP, CommStats, Communicator
from zero_lab.ddp_buckets import DdpBuckets
from zero_lab.dtensors import check_plain_params
from zero_lab.elementwise import ELEMENTWISE_OPTIMIZERS, is_elementwise
from zero_lab.exchange import ExchangeReport, ParamExchange, share_grads_with_joined
from zero_lab.hierarchy import Hierarchy, hierarchy_of
from zero_lab.partition import DdpBucket, ParamSpec, Partition, Partitioner, SortedGreedy
from zero_lab.pipeline import LocalShard, StepPipeline, params_of, sync_param_groups
from zero_lab.shard_state import merge_states, slice_state
from zero_lab.state_server import ShardStateServer, default_store, fetch_shard_states
from zero_lab.torch_compat import TorchPrivateNames

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "OVERLAP_EXCHANGES",
    "LocalShard",
    "ZeroRedundancyOptimizer",
    "check_partition_fits",
]

logger = logging.getLogger(__name__)

_NOT_HYPERPARAMETERS = NOT_HYPERPARAMETERS

#: State entry holding the fp32 master copy of a parameter (``master_weights=True``).
MASTER_KEY = "master_param"

#: Key of the marker :meth:`ZeroRedundancyOptimizer.state_dict` adds to a rank's own shard.
SHARD_KEY = "zero_lab_shard"

# Optimizers constructed per process group (its ranks joined by "-"): their shard-state server keys.
_SERVED_OPTIMIZERS: dict[str, int] = {}


def _after_step(optimizer: ZeroRedundancyOptimizer, args: Any, kwargs: Any) -> None:
    """Step post-hook: the state changed (see ``ZeroRedundancyOptimizer._state_changed``)."""
    optimizer._state_changed()


def _reseat_bucket_views(optimizer: ZeroRedundancyOptimizer, args: Any, kwargs: Any) -> None:
    """Step pre-hook (bucket views): parameters a client moved after construction (accelerate's
    ``prepare``: ``model.to("cpu:0")`` copies) become views of the exchange's buffers again."""
    optimizer._exchange.wait()
    moved = reseat(optimizer._exchange.buffers, optimizer.all_params)
    if moved:
        logger.info("zero_lab: %d parameters were moved out of their bucket views; views restored", len(moved))


class _ShardStateView(Mapping):
    """``param -> state`` of the shards this rank steps (``ZeroRedundancyOptimizer.state``)."""

    def __init__(self, zero: ZeroRedundancyOptimizer):
        self._held = {id(shard.param): shard.tensor for shard in zero.local_shards()}
        self._params = {id(p): p for p in zero.all_params}
        self._state = zero._optim.state

    def __getitem__(self, param: Any) -> dict[str, Any]:
        tensor = self._held.get(id(param))
        if tensor is None or tensor not in self._state or not self._state[tensor]:
            raise KeyError(param)
        return self._state[tensor]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self._params[key] for key, tensor in self._held.items() if self._state.get(tensor))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def check_partition_fits(
    partition: Partition,
    optimizer_class: type[Optimizer],
    partitioner: Any = None,
    group_classes: list[type[Optimizer]] | None = None,
) -> None:
    """Raise ``ValueError`` when a parameter ``partition`` cuts is stepped by a class that is
    not elementwise (:func:`zero_lab.elementwise.is_elementwise`): a range is stepped
    without the rest of its tensor. ``group_classes`` gives each param group's class
    (default: ``optimizer_class`` for all); the error names the first such parameter.
    """
    cut = set(partition.cut_params())
    cut.update(i for layout in partition.layouts for i in layout.params)
    classes = group_classes or []
    for index in sorted(cut):
        spec = partition.specs[index]
        cls = classes[spec.group] if spec.group < len(classes) else optimizer_class
        if spec.elementwise and is_elementwise(cls):
            continue
        name = repr(spec.name) if spec.name is not None else f"#{index}"
        raise ValueError(
            f"partitioner {partitioner!r} cuts parameter {name} (shape {tuple(spec.shape)}) into element "
            f"ranges, which needs an elementwise optimizer; {cls.__name__} is not one (declare one with a class "
            "attribute `elementwise = True` or zero_lab.register_elementwise). Use a whole-parameter partitioner "
            "(SortedGreedy, Manual) instead."
        )


def _normalize_params(params: Any) -> list[dict[str, Any]]:
    """Validate ``params`` and return it as a list of param-group dicts (torch's errors)."""
    if isinstance(params, torch.Tensor):
        raise TypeError(f"`params` argument should be an iterable of Tensors, but got {torch.typename(params)}")
    try:
        entries = list(params)
    except TypeError as error:
        raise TypeError(
            f"`params` argument should be an iterable of Tensors or dicts, but got {torch.typename(params)}"
        ) from error
    if not entries:
        raise ValueError("ZeroRedundancyOptimizer got an empty parameter list")
    if all(isinstance(e, dict) for e in entries):
        for group in entries:
            if "params" not in group:
                raise ValueError(
                    "Each parameter group passed-in via `params` must have a 'params' key mapping to the "
                    "parameters in the group"
                )
        groups = [dict(g) for g in entries]
    elif all(isinstance(e, torch.Tensor) for e in entries) or all(
        isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], torch.Tensor) for e in entries
    ):
        groups = [{"params": entries}]
    else:
        raise TypeError("`params` argument should be an iterable of Tensors or dicts (or named parameters)")
    for group in groups:
        tensors = group["params"]
        group["params"] = [tensors] if isinstance(tensors, (torch.Tensor, tuple)) else list(tensors)
        for item in group["params"]:
            tensor = item[1] if isinstance(item, tuple) else item
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"`params` must hold Tensors, but got {torch.typename(tensor)}")
    return groups


def _check_same_dense_type(params: list[torch.Tensor]) -> None:
    typename = torch.typename(params[0])
    if params[0].is_sparse:
        raise ValueError(
            f"ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got {typename}"
        )
    for param in params[1:]:
        if torch.typename(param) != typename or param.is_sparse:
            raise ValueError(
                "ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got "
                f"both {typename} and {torch.typename(param)}"
            )


#: The ``exchange=`` values the overlap hooks honour: they broadcast each DDP bucket from its owners.
OVERLAP_EXCHANGES = ("auto", "broadcast")


def _exchange_of(exchange: str, overlap_with_ddp: bool) -> str:
    """The collective the optimizer's own exchange uses: ``exchange``, except that with
    overlap the hooks broadcast each DDP bucket, so ``auto`` is ``broadcast`` and
    any other collective is refused."""
    if exchange != "auto":
        collective_named(exchange)  # raises, listing the registered collectives
    if not overlap_with_ddp:
        return exchange
    if exchange not in OVERLAP_EXCHANGES:
        raise ValueError(
            f"exchange={exchange!r} with overlap_with_ddp=True: the overlap hooks exchange each DDP bucket by "
            "broadcasts from its owners; pass exchange='broadcast' or 'auto' (which is broadcast there)"
        )
    return "broadcast"


class _ZeroJoinHook(JoinHook):
    """On a rank that ran out of inputs: take part in the step of the ranks still training."""

    def __init__(self, zero: ZeroRedundancyOptimizer):
        self.zero = zero

    def main_hook(self) -> None:
        self.zero._step_as_joined()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.zero._end_join()


class ZeroRedundancyOptimizer(Optimizer, Joinable, TorchPrivateNames):
    """Shards the state of ``optimizer_class`` across the ranks of ``process_group``.

    Args:
        params: tensors, ``named_parameters()`` pairs, or param-group dicts.
        optimizer_class: any ``torch.optim.Optimizer`` class; ``**defaults`` go to it.
        process_group: the data-parallel group (default: the world).
        shard_size: partition the state over groups of this many consecutive ranks of
            ``process_group`` and replicate it across the groups (:mod:`zero_lab.hierarchy`;
            default ``None``: one group, the whole ``process_group``; ``"node"``: the ranks of one
            node, as torchrun or srun say). It must divide the
            group's size; every rank of the world constructs (the groups are created here).
            Then ``process_group``, ``rank`` and ``world_size`` are this rank's *shard group*'s
            (the partition, the exchange, consolidation and the state server live there);
            gradients still come from DDP over the whole group (or :func:`zero_lab.grad_reduce.reduce_gradients`,
            which reduces inside the shard group, then across replicas).
        parameters_as_bucket_view: pack parameters into contiguous buffers so the
            exchange is one collective per buffer (``param.data`` become views).
        overlap_with_ddp: step inside a DDP comm hook (see ``zero_lab.overlap``).
        partitioner: a :class:`~zero_lab.partition.Partitioner` (default sorted-greedy,
            the assignment torch's class makes; DDP-bucket with overlap).
        ddp_buckets: DDP's gradient bucket of each parameter, ``{id(param): bucket}``
            (:func:`zero_lab.ddp_buckets.ddp_bucket_map`), for partitioners that follow
            them (``DdpBucket``). With ``overlap_with_ddp=True`` and none given, DDP's
            default caps modelled over ``params`` (:class:`zero_lab.ddp_buckets.DdpBuckets`):
            the shards are built here either way, never when the hook attaches.
        master_weights: keep this rank's shards of low-precision (bf16/fp16) parameters
            as fp32 masters: the optimizer and its state work in fp32, each step writes
            the rounded result back into the parameter, and the low-precision copy is
            what the ranks exchange (the DeepSpeed/Megatron mixed-precision recipe).
        exchange: ``"broadcast"`` (one broadcast per rank's range of each buffer, or per
            shard without buffers), ``"all_gather"`` (one ``all_gather_into_tensor`` per
            buffer), ``"p2p_all_gather"``, a registered one, or ``"auto"`` (the in-place ones timed
            on the first step's exchange, one rule on every rank; see :meth:`exchange_report`). With overlap the
            hooks broadcast each DDP bucket: ``auto`` is broadcast, any other collective is refused.

    The partitioner cannot change after construction: the partition, the local optimizer and
    the exchange are one :class:`~zero_lab.pipeline.StepPipeline`, built here once.
    """

    def __init__(
        self,
        params: Iterable[Any],
        optimizer_class: type[Optimizer],
        process_group: Any | None = None,
        parameters_as_bucket_view: bool = False,
        overlap_with_ddp: bool = False,
        partitioner: Partitioner | None = None,
        master_weights: bool = False,
        exchange: str = "auto",
        ddp_buckets: Mapping[int, int] | None = None,
        shard_size: int | str | None = None,
        **defaults: Any,
    ):
        groups = _normalize_params(params)
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
        self._exchange_collective = _exchange_of(exchange, overlap_with_ddp)
        self._initialized = False
        self._optimizer_class = optimizer_class
        Optimizer.__init__(self, groups, defaults)
        Joinable.__init__(self)
        check_plain_params(self.all_params, [n for g in self.param_groups for n in g.get("param_names", g["params"])])
        _check_same_dense_type(self.all_params)

        self.hierarchy: Hierarchy = hierarchy_of(process_group, shard_size)  # the groups, made once (on every rank)
        self.process_group = self.hierarchy.shard_group
        self._data_parallel_group = process_group if process_group is not None else dist.group.WORLD
        self._comm = Communicator(self.process_group)
        check_same_params_on_every_rank(self._comm, self.all_params)  # one small all-gather; raises on every rank
        self._replica_comm: Communicator | None = None
        if self.hierarchy.hierarchical:
            self._replica_comm = Communicator(self.hierarchy.replica_group, stats=self._comm.stats, link=INTER_GROUP)
            check_same_params_on_every_rank(self._replica_comm, self.all_params)  # shard + replica groups: all pairs
        self._exchange_choice = exchange
        self.world_size: int = self._comm.world_size
        self.rank: int = self._comm.rank
        self.global_rank: int = self._comm.global_rank(self.rank)
        self._overlap_with_ddp = overlap_with_ddp
        if overlap_with_ddp and parameters_as_bucket_view:
            logger.warning("parameters_as_bucket_view is ignored with overlap_with_ddp=True: buckets follow DDP's")
            parameters_as_bucket_view = False
        self.parameters_as_bucket_view = parameters_as_bucket_view
        default = DdpBucket() if overlap_with_ddp else SortedGreedy()
        self._partitioner: Partitioner = partitioner if partitioner is not None else default
        if ddp_buckets is None and overlap_with_ddp:
            ddp_buckets = DdpBuckets().bucket_of(self.all_params)  # DDP's default caps, modelled
        self._ddp_buckets: dict[int, int] = dict(ddp_buckets or {})  # id(param) -> DDP bucket
        self.master_weights = master_weights
        self._optim_defaults = defaults
        self._default_device = self.all_params[0].device
        self._join_active = False
        self._consolidated: list[dict[int, tuple[int, int, dict[str, Any]]]] = []

        self._pipeline = self._build_pipeline()
        self._init_state_protocol()
        self._initialized = True

    def _build_pipeline(self) -> StepPipeline:
        """Partition, exchange and local optimizer, built together once (the constructor)."""
        partition = self._compute_partition()
        exchange = ParamExchange(
            self.all_params, partition, self._comm, self.parameters_as_bucket_view, self._exchange_collective
        )
        return StepPipeline(
            self.param_groups,
            partition,
            exchange,
            rank=self.rank,
            optimizer_class=self._optimizer_class,
            defaults=self._optim_defaults,
            master_weights=self.master_weights,
            overlap_with_ddp=self._overlap_with_ddp,
            partitioner=self._partitioner,
            ddp_buckets=self._ddp_buckets,
        )

    @property
    def pipeline(self) -> StepPipeline:
        """This optimizer's step: reduce gradients -> step owned shards -> exchange parameters."""
        return self._pipeline

    @property
    def partition(self) -> Partition:
        """Who steps which elements of which parameter (fixed at construction)."""
        return self._pipeline.partition

    @property
    def _exchange(self) -> ParamExchange:
        return self._pipeline.exchange

    @property
    def _optim(self) -> ChainedOptimizer:
        return self._pipeline.optim

    # ------------------------------------------------------------------ shard API
    @property
    def optim(self) -> Optimizer:
        """The local optimizer over this rank's shards (built once, at construction).

        With one class (torch's API) it is that class's instance. When param groups name
        several classes (``"optimizer_class"``), it is a
        :class:`~zero_lab.chained.ChainedOptimizer` whose ``optimizers`` are the per-class
        local optimizers and whose ``param_groups`` are this rank's groups in order.
        """
        inner = self._optim.optimizers
        return inner[0] if len(inner) == 1 else self._optim

    def group_classes(self) -> list[type[Optimizer]]:
        """The class stepping each param group, in order (``"optimizer_class"``, else ``optimizer_class``)."""
        return [group_class(g, self._optimizer_class) for g in self.param_groups]

    @property
    def partitioner(self) -> Partitioner:
        """The partitioner (fixed at construction: ``partitioner=``)."""
        return self._partitioner

    @property
    def overlap_with_ddp(self) -> bool:
        return self._overlap_with_ddp

    @property
    def communicator(self) -> Communicator:
        """The metered collectives on ``process_group`` this optimizer uses."""
        return self._comm

    @property
    def shard_size(self) -> int:
        """The ranks the state is partitioned over (``world_size``); the data-parallel group has
        ``shard_size * hierarchy.replicas`` ranks."""
        return self.hierarchy.shard_size

    @property
    def replica_communicator(self) -> Communicator | None:
        """The metered collectives on this rank's replica group (the ranks holding the same
        shards in the other shard groups); ``None`` without hierarchy (``shard_size`` = W)."""
        return self._replica_comm

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """torch's param groups. The pipeline reads its hyper-parameters from this very list
        before each step and writes them back after; a list assigned here (a client's wrapper
        may) becomes the pipeline's too."""
        try:
            return self.__dict__["param_groups"]
        except KeyError:
            raise AttributeError("param_groups") from None

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.__dict__["param_groups"] = groups
        if (pipeline := self.__dict__.get("_pipeline")) is not None:
            pipeline.groups = groups

    @property
    def all_params(self) -> list[torch.Tensor]:
        """Every parameter, by global index (param groups in order)."""
        return params_of(self.param_groups)

    def local_shards(self) -> list[LocalShard]:
        """The shards this rank steps, with the tensor its local optimizer holds for each."""
        return self._pipeline.local_shards()

    def wait_for_exchange(self, params: Iterable[int] | None = None) -> None:
        """Finish an exchange in flight (``prefetch_exchange``): the units holding the
        parameters with these global indices, or all of it. Call it before reading
        parameters outside a forward (``model.state_dict()``, an EMA update)."""
        self._pipeline.wait_for_exchange(params)

    @property
    def local_step_seconds(self) -> float:
        """Running total of this rank's local optimizer steps (no exchange), in ``step()`` or the overlap hooks."""
        return self._pipeline.local_step_seconds

    def exchange_report(self) -> ExchangeReport:
        """The exchange's layout and collective; with ``exchange="auto"`` after the first
        step also the measured time of each candidate (max over ranks). With an overlap
        hook attached (:meth:`StepPipeline.attach_per_bucket <zero_lab.pipeline.StepPipeline.attach_per_bucket>`),
        the hook's per-bucket broadcasts."""
        return self._pipeline.exchange_report(self._exchange_choice)

    # ------------------------------------------------------------------ partition

    def _param_specs(self) -> list[ParamSpec]:
        classes = self.group_classes()
        return [
            ParamSpec.of(
                param,
                name=name,
                group=index,
                bucket=self._ddp_buckets.get(id(param)),
                elementwise=is_elementwise(classes[index]),
                stepper=classes[index].__name__,
            )
            for index, group in enumerate(self.param_groups)
            for param, name in zip(group["params"], group.get("param_names", [None] * len(group["params"])))
        ]

    def _compute_partition(self) -> Partition:
        partition = self.partitioner(self._param_specs(), self.world_size)
        check_partition_fits(partition, self._optimizer_class, self.partitioner, self.group_classes())
        return partition

    # ------------------------------------------------------------------ stepping
    #: torch's name (``src`` -> ``dst``, every key but the parameters), read by code written for torch's class.
    _sync_param_groups = staticmethod(sync_param_groups)

    def _local_step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:
        """Step this rank's shards only (no communication; torch's name): the pipeline's local step."""
        return self._pipeline.local_step(closure, **kwargs)

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:  # type: ignore[override]
        """Step this rank's shards, then exchange updated parameters with all ranks
        (:meth:`StepPipeline.step <zero_lab.pipeline.StepPipeline.step>`).

        Torch's contract around it: with ``overlap_with_ddp=True`` the step happens inside
        DDP's backward (see :mod:`zero_lab.overlap`) and this is a no-op, as in torch; an
        exchange still in flight (prefetch) is finished first; under ``Join`` the ranks that
        ran out of inputs are told, and share the gradients they reduce.
        """
        if self._overlap_with_ddp:
            if not getattr(self, "_warned_overlap_step", False):
                logger.warning("step() does nothing with overlap_with_ddp=True: the DDP comm hook steps")
                self._warned_overlap_step = True
            return None
        self._pipeline.wait_for_exchange()
        Join.notify_join_context(self)
        if self._join_active:
            share_grads_with_joined(self._comm, self.all_params, self.partition, active=True)
        return self._pipeline.step(closure, **kwargs)

    @torch.no_grad()
    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> torch.Tensor:
        """Clip gradients by their global norm, computed from the shards: one scalar all-reduce.

        Each rank takes the ``norm_type`` norm of the gradient elements it owns (the
        shards tile the model, and after DDP's all-reduce every rank holds the same
        gradients), the ranks combine them (sum of p-th powers, or MAX for ``inf``),
        and every gradient is scaled as ``torch.nn.utils.clip_grad_norm_`` would.
        Returns the total norm. Call it between ``backward()`` and ``step()``.
        """
        if self._overlap_with_ddp:
            raise RuntimeError(
                "clip_grad_norm_ needs every gradient before the step, but with overlap_with_ddp=True the step "
                "runs inside backward; clip without overlap (overlap=false)"
            )
        self._exchange.wait()
        norm_type = float(norm_type)
        params = self.all_params
        pieces = [
            params[s.param].grad.reshape(-1)[s.start : s.stop]
            for s in self.partition.shards_of(self.rank)
            if params[s.param].grad is not None
        ]
        local = (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p, norm_type) for p in pieces]), norm_type)
            if pieces
            else torch.zeros((), device=self._default_device)
        ).float()
        if norm_type == float("inf"):
            total = self._comm.all_reduce(local.reshape(1), dist.ReduceOp.MAX, op="grad_norm")[0]
        else:
            total = self._comm.all_reduce(local.pow(norm_type).reshape(1), op="grad_norm")[0].pow(1.0 / norm_type)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients is non-finite, so it cannot be clipped. "
                "Pass error_if_nonfinite=False to skip this check."
            )
        # torch's own scaling, by clamp(max_norm / (total + 1e-6), max=1), as clip_grad_norm_ does
        torch.nn.utils.clip_grads_with_norm_([p for p in params if p.grad is not None], max_norm, total)
        return total

    def master_weight_bytes(self) -> int:
        """Bytes of this rank's fp32 master shards (0 without ``master_weights``)."""
        return self._pipeline.master_bytes()

    @property
    def comm_stats(self) -> CommStats:
        """Running totals (calls, bytes, seconds) of this optimizer's collectives."""
        return self._comm.stats

    @property
    def exchange_mode(self) -> str:
        """``<layout>_<collective>`` (e.g. ``flat_broadcast``), or the overlap hook's (``overlap_per_bucket``)."""
        return self.exchange_report().mode

    # ------------------------------------------------------------------ param groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; its parameters go to the least-loaded ranks, old shards stay put.

        Must be called on all ranks. A group naming another class (``"optimizer_class"``)
        gets that class's defaults, not ``**defaults`` (which belong to ``optimizer_class``),
        and is stepped by this rank's local optimizer of that class (created if new).
        """
        cls = group_class(param_group, self._optimizer_class)
        if cls is self._optimizer_class:
            super().add_param_group(param_group)
        else:
            self._add_group_of_class(param_group, cls)
        if not self._initialized:
            return  # Optimizer.__init__ adding the constructor's groups: the pipeline is built after
        self._pipeline.extend(self._compute_partition())

    def _add_group_of_class(self, param_group: dict[str, Any], cls: type[Optimizer]) -> None:
        """Add a group of another class, filled with *its* class's defaults (probed on meta
        tensors of the group's shapes, so a class that checks shapes refuses wrong ones here)."""
        try:
            defaults = class_defaults(cls, param_group)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"param group {len(self.param_groups)} (optimizer_class={cls.__name__}) is refused by "
                f"{cls.__name__}: {error}. Route only the parameters it can step to it "
                "(e.g. zero_lab.muon_param_groups(model) for Muon)"
            ) from None
        for key, value in defaults.items():
            param_group.setdefault(key, value)
        param_group[GROUP_CLASS_KEY] = cls
        main_defaults, self.defaults = self.defaults, {}
        try:
            super().add_param_group(param_group)
        finally:
            self.defaults = main_defaults

    # ------------------------------------------------------------------ state
    def _init_state_protocol(self) -> None:
        """Bookkeeping for :meth:`state_dict` (see there): the state's version (bumped by every
        step and load, through a step post-hook so the step path stays as it is), the
        consolidation target and cache, and the key this optimizer's shard-state server is
        published under (:mod:`zero_lab.state_server`; the same on every rank, since
        constructors run in the same order everywhere)."""
        self._state_version = 0
        self._consolidated_to = 0
        self._consolidated_version = -1
        self._state_server: ShardStateServer | None = None
        ranks = "-".join(map(str, dist.get_process_group_ranks(self.process_group)))
        count = _SERVED_OPTIMIZERS.get(ranks, 0)
        _SERVED_OPTIMIZERS[ranks] = count + 1
        self._server_key = f"zero_lab/shard_states/{ranks}/{count}"
        self.register_step_post_hook(_after_step)
        if self.parameters_as_bucket_view:
            self.register_step_pre_hook(_reseat_bucket_views)

    def _state_changed(self) -> None:
        """A step or a load changed this rank's state: cached consolidations are stale, and
        from now on this rank serves its shards to the saving rank (when W > 1)."""
        self._state_version += 1
        if self._state_server is None and self.world_size > 1 and (store := default_store()) is not None:
            self._state_server = ShardStateServer(self._server_key, self.rank, self, store)
            self._state_server.start()

    @property
    def state(self) -> Mapping[torch.Tensor, dict[str, Any]]:  # type: ignore[override]
        """This rank's shard states, keyed by parameter (live, read-only): the entries of the
        local optimizer's state for the tensor stepping each shard (a slice shard's tensors
        are 1-D, its elements only). Empty before the first step and on a rank owning nothing,
        so "has this optimizer state?" (torchtitan's ``init_optim_state``) gets the truth."""
        if not getattr(self, "_initialized", False):
            return {}  # still in the constructor: no state yet
        return _ShardStateView(self)

    @state.setter
    def state(self, value: Any) -> None:
        """Ignored: ``torch.optim.Optimizer`` assigns an empty state; the shards' state lives in :attr:`optim`."""

    @property
    def _all_state_dicts(self) -> list[dict[int, tuple[int, int, dict[str, Any]]]]:
        """torch's name for the consolidated copy (non-empty only on the target after
        :meth:`consolidate_state_dict`; per rank, its shard states); code written for torch's
        class tests it, or assigns ``[]`` to free the memory."""
        return self._consolidated

    @_all_state_dicts.setter
    def _all_state_dicts(self, value: list[Any]) -> None:
        self._consolidated = list(value)

    def local_shard_states(self) -> dict[int, tuple[int, int, dict[str, Any]]]:
        """This rank's state as ``{global index: (start, stop, state on CPU)}``."""
        self._exchange.wait()
        return self.collect_shard_states()

    def collect_shard_states(self) -> dict[int, tuple[int, int, dict[str, Any]]]:
        """:meth:`local_shard_states` without waiting for an exchange in flight (what the
        shard-state server reads, on its own thread, while this rank's loop runs on)."""
        params = self.all_params
        starts = {s.param: (s.start, s.stop) for s in self.partition.shards_of(self.rank)}
        local_state = self._optim.state_dict()["state"]
        masters = {(id(param), start): master for master, param, start, _ in self._pipeline.masters}
        out = {}
        for local_index, global_index in enumerate(self._pipeline.local_index):
            state = dict(local_state.get(local_index, {}))
            start, stop = starts.get(global_index, (0, params[global_index].numel()))
            master = masters.get((id(params[global_index]), start))
            if master is not None and state:
                state[MASTER_KEY] = master.detach().clone()
            if state:
                out[global_index] = (start, stop, {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()})
        return out

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's shard states on rank ``to`` (CPU), one rank at a time.

        Must be called on all ranks (the clients that know ZeRO, e.g. Lightning, do so before
        every save). Afterwards :meth:`state_dict` on rank ``to`` returns the full state in plain
        ``torch.optim`` format, from this copy until the next step or load; ``to`` becomes
        the consolidation target. With ``shard_size`` < W, ``to`` is a rank of the shard group
        and shard group 0 gathers (its rank ``to`` is global rank ``to``); the other groups
        hold replicas and gather nothing.
        """
        check_target_rank(to, self.world_size)
        self._sync_param_groups(self.param_groups, self._optim.param_groups)
        if self.hierarchy.group_index > 0:  # a replica of shard group 0's state: that group consolidates
            self._consolidated, self._consolidated_to = [], to
            return
        mine = self.local_shard_states()
        gathered: list[dict[int, tuple[int, int, dict[str, Any]]]] = []
        for rank in range(self.world_size):
            if rank == self.rank and rank == to:
                gathered.append(mine)
            elif self.rank == to:
                gathered.append(self._comm.recv_object(src=rank, device=self._default_device))
            elif self.rank == rank:
                self._comm.send_object(mine, dst=to, device=self._default_device)
        self._consolidated = gathered if self.rank == to else []
        self._consolidated_to = to
        self._consolidated_version = self._state_version

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state, answered on any rank without a collective:

        * before any state exists (no step, no load): the empty plain form,
          ``{"state": {}, "param_groups": [...]}``, on every rank;
        * on the consolidation target (rank 0, or the last ``consolidate_state_dict(to=)``):
          the full state in plain ``torch.optim`` format (global indices) — from the
          consolidated copy when it is current, else fetched from the other ranks'
          shard-state servers (:mod:`zero_lab.state_server`), so a loop that calls this on
          one rank only (HF Trainer) saves everything;
        * on any other rank: **this rank's shard** — the same format restricted to the
          elements it owns, plus ``"zero_lab_shard": {"rank", "world_size", "ranges"}``.
          It loads back into this rank of the same partition (a per-rank save resumes);
          elsewhere :meth:`load_state_dict` refuses it, naming the target's full state.
        """
        self._exchange.wait()
        if self._state_version == 0:
            return self._packed_state([])
        if self.world_size == 1:
            return self._packed_state([self.collect_shard_states()])
        if self.rank != self._consolidated_to:
            mine = self.collect_shard_states()
            packed = self._packed_state([mine])
            ranges = {index: [start, stop] for index, (start, stop, _) in mine.items()}
            packed[SHARD_KEY] = {"rank": self.rank, "world_size": self.world_size, "ranges": ranges}
            return packed
        if self._consolidated and self._consolidated_version == self._state_version:
            return self._packed_state(self._consolidated)
        return self._packed_state(self._fetch_shard_states())

    def _fetch_shard_states(self) -> list[dict[int, tuple[int, int, dict[str, Any]]]]:
        """Every rank's shard states, this rank's own read here, the others' from their servers."""
        store = default_store()
        if store is None:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. "
                f"Please call `consolidate_state_dict(to={self.rank})` on all ranks beforehand if you meant to "
                "save the global state."
            )
        return [
            self.collect_shard_states() if rank == self.rank else fetch_shard_states(store, self._server_key, rank)
            for rank in range(self.world_size)
        ]

    def _packed_state(self, per_rank: list[dict[int, tuple[int, int, dict[str, Any]]]]) -> dict[str, Any]:
        """Shard states of some ranks glued per parameter, in plain ``torch.optim`` format."""
        params = self.all_params
        pieces: dict[int, list[tuple[tuple[int, int], dict[str, Any]]]] = {}
        for rank_states in per_rank:
            for index, (start, stop, state) in rank_states.items():
                pieces.setdefault(index, []).append(((start, stop), state))
        state = {index: merge_states(pieces[index], params[index].shape) for index in sorted(pieces)}
        classes = self.group_classes()
        several = len(set(classes)) > 1
        groups, offset = [], 0
        for group, cls in zip(self.param_groups, classes):
            packed = {k: v for k, v in group.items() if k != "params"}
            if several or GROUP_CLASS_KEY in packed:  # several classes: every group names its own (a path)
                packed[GROUP_CLASS_KEY] = class_path(cls)
            packed["params"] = list(range(offset, offset + len(group["params"])))
            offset += len(group["params"])
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Load a full ZeRO state, a plain optimizer's state, or this rank's own shard (what
        :meth:`state_dict` returns off the target); each rank keeps its shards.

        With several classes: a consolidated state of the same groups (each naming its
        class), or a list of the plain optimizers' state dicts, one per class in order of
        first use (``[muon.state_dict(), adamw.state_dict()]``, see
        :func:`zero_lab.chained.merge_state_dicts`).
        """
        classes = self.group_classes()
        if isinstance(state_dict, (list, tuple)):
            state_dict = merge_state_dicts(state_dict, classes)
        if "param_groups" not in state_dict:
            raise ValueError(
                f"load_state_dict got a state dict without 'param_groups' (keys: {sorted(state_dict)}): an empty "
                "dict is what a client keeps off the saving rank; load the state saved on the consolidation "
                "target (rank 0) on every rank"
            )
        groups = state_dict["param_groups"]
        check_group_classes(groups, classes, "state_dict param group")
        self._check_group_sizes([len(g["params"]) for g in groups])
        params = self.all_params
        saved_keys = [key for g in groups for key in g["params"]]  # saved key of global index i
        shard = state_dict.get(SHARD_KEY)
        if shard is not None:
            ranges = self._check_own_shard(shard)

            def state_of(index: int, start: int, stop: int) -> dict[str, Any] | None:
                saved = state_dict["state"].get(saved_keys[index])
                return None if saved is None or ranges.get(index) != (start, stop) else dict(saved)

        else:
            elementwise = [is_elementwise(cls) for cls, g in zip(classes, self.param_groups) for _ in g["params"]]
            names = [s.name for s in self.partition.specs]
            check_state_matches_params(state_dict, params, names, elementwise)

            def state_of(index: int, start: int, stop: int) -> dict[str, Any] | None:
                saved = state_dict["state"].get(saved_keys[index])
                return None if saved is None else slice_state(saved, params[index].shape, start, stop)

        self.load_shard_states(state_of, groups)

    def _check_own_shard(self, shard: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
        """A shard state (``"zero_lab_shard"``) loads only into the rank and partition that saved it."""
        ranges = {int(index): (int(bounds[0]), int(bounds[1])) for index, bounds in shard["ranges"].items()}
        mine = {s.param: (s.start, s.stop) for s in self.partition.shards_of(self.rank)}
        if (
            shard["rank"] != self.rank
            or shard["world_size"] != self.world_size
            or any(mine.get(i) != r for i, r in ranges.items())
        ):
            raise ValueError(
                f"load_state_dict got rank {shard['rank']}'s shard of a {shard['world_size']}-rank optimizer "
                f"(what state_dict() returns off the consolidation target), but this is rank {self.rank} of "
                f"{self.world_size} with another partition; it holds only that rank's state. Load the full state "
                "that state_dict() returns on the consolidation target (rank 0) on every rank"
            )
        return ranges

    def _check_group_sizes(self, sizes: list[int]) -> None:
        expected = [len(g["params"]) for g in self.param_groups]
        if sizes != expected:
            raise ValueError(
                f"state_dict has param groups of sizes {sizes} but this optimizer has {expected}; "
                "load a state saved from the same parameters"
            )

    def load_shard_states(
        self, state_of: Callable[[int, int, int], dict[str, Any] | None], groups: list[dict[str, Any]]
    ) -> None:
        """Load this rank's shards: ``state_of(global index, start, stop)`` gives each one's state.

        ``groups`` carries the hyperparameters to restore (one dict per param group).
        """
        self._exchange.wait()
        params = self.all_params
        bounds = {s.param: (s.start, s.stop) for s in self.partition.shards_of(self.rank)}
        masters = {(id(param), start): master for master, param, start, _ in self._pipeline.masters}
        local_state = {}
        for local_index, global_index in enumerate(self._pipeline.local_index):
            start, stop = bounds[global_index]
            piece = state_of(global_index, start, stop)
            master = masters.get((id(params[global_index]), start))
            saved_master = None if piece is None else piece.pop(MASTER_KEY, None)
            if master is not None:
                # Without a saved fp32 master (a plain optimizer's state), start from the parameter.
                source = saved_master
                if source is None:
                    source = slice_state(
                        {MASTER_KEY: params[global_index].detach()}, params[global_index].shape, start, stop
                    )[MASTER_KEY]
                master.copy_(source.reshape(master.shape))
            if piece:
                local_state[local_index] = piece
        local_groups, offset = [], 0
        for group, local in zip(groups, self._optim.param_groups):
            packed = {k: v for k, v in group.items() if k not in _NOT_HYPERPARAMETERS}
            packed["params"] = list(range(offset, offset + len(local["params"])))
            offset += len(local["params"])
            local_groups.append(packed)
        self._optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._state_changed()
        self._sync_param_groups(groups, self.param_groups)
        self._sync_param_groups(self.param_groups, self._optim.param_groups)

    # ------------------------------------------------------------------ join
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """Hook for ``torch.distributed.algorithms.Join`` (uneven inputs).

        Ranks that ran out of inputs keep stepping their shards with the gradients the
        active ranks computed (DDP's join averages with zeros from joined ranks), so
        the parameters end as with DDP + the plain optimizer on the active ranks.
        List the DDP model before this optimizer in ``Join([...])``. With ``shard_size`` < W a
        rank that actually runs out first raises (it cannot shadow another group's steps); even
        inputs under ``Join`` train as without it.
        """
        if not self._pipeline.grad_reduce.joinable:
            raise RuntimeError(
                "Join with grad_reduce (zero_lab.grad_reduce.reduce_gradients): a joined rank cannot shadow the "
                "point-to-point gradient reduction; use grad_reduce='all_reduce' (DDP's hook) with Join"
            )
        self._join_active = True
        return _ZeroJoinHook(self)

    def _end_join(self) -> None:
        """Every rank joined (Join's post-hook): steps no longer share gradients with joined ranks."""
        self._join_active = False

    @property
    def join_device(self) -> torch.device:
        return self._default_device

    @property
    def join_process_group(self) -> Any:
        """The data-parallel group (with ``shard_size`` < W not ``process_group``, the shard group):
        Join counts the ranks still training over the group DDP spans."""
        return self._data_parallel_group

    def _step_as_joined(self) -> None:
        if self.hierarchy.hierarchical:
            raise RuntimeError(
                f"Join with shard_size={self.shard_size} < {self.hierarchy.world_size} ranks: this rank ran out of "
                "inputs, and a joined rank cannot shadow the steps of its shard group; give every rank the same "
                "number of batches, or use shard_size=None (the whole world) with uneven inputs"
            )
        self._pipeline.wait_for_exchange()
        share_grads_with_joined(self._comm, self.all_params, self.partition, active=False)
        self._pipeline.step()
