"""``ShardedDataParallel``: data parallelism with ZeRO-2 on buffers zero_lab owns, beside DDP.

    model = ShardedDataParallel(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    for x in data:
        optimizer.zero_grad(); model(x).sum().backward(); optimizer.step()
    model.close()   # before destroy_process_group(): waits for what is still in flight

What it does, per step (the lineage: FairScale's ShardedDDP, Megatron-Core's distributed
optimizer, DeepSpeed's stage 2):

1. **construction** — rank 0's parameters and buffers are broadcast (as DDP does); the trainable
   parameters are laid out in buckets in backward order, about a layer each
   (:mod:`zero_lab.engine.layout`, ``bucket_cap_mb``), each owned range by one rank (the
   ``partitioner``), and re-seated as views of one contiguous buffer per bucket
   (:mod:`zero_lab.engine.buffer`). The user's optimizer is re-pointed at this rank's ranges: its
   param groups' ``params`` become one 1-D view per bucket it owns a part of, so its state is
   ≈ 1/W and its ``step()`` updates the parameter buffer in place (no proxy, no copy back). It must
   be elementwise (:func:`zero_lab.is_elementwise`: Adam, AdamW, SGD, ...) and not have stepped yet;
   a param group whose class is not (Muon, in a :class:`~zero_lab.ChainedOptimizer`) keeps the
   whole parameters this rank owns instead, each stepped on its owner (:mod:`zero_lab.engine.whole`;
   a whole-parameter partitioner, ``SortedGreedy()`` by default then);
2. **backward** — each parameter's post-accumulate-grad hook moves its gradient into its bucket;
   a complete bucket is reduced to its owners at once, overlapping the rest of backward (by default
   through shared-memory mailboxes where every rank is on one x86-64 host, :mod:`zero_lab.host_shm`,
   else point to point over Gloo or the backend's reduce-scatter: :func:`default_modes`), and its
   buffer is released when the reduction is done (:mod:`zero_lab.engine.bucket_group`). A rank
   holds at most its owned gradients plus two buckets (ZeRO-2 at the peak). ``param.grad`` is
   ``None`` afterwards: the reduced gradients are the ``.grad`` of the optimizer's views;
3. **step** — an optimizer step pre-hook finishes the reductions (buckets with parameters no
   gradient reached complete with zeros); the optimizer steps the owned ranges; a step post-hook
   issues each bucket's parameter all-gather in forward order. With ``prefetch=True`` the next
   forward waits for each bucket just before the first module that uses it; otherwise the step
   waits for all of them. :attr:`ShardedDataParallel.local_step_seconds` times the optimizer's own
   step on this rank's ranges alone: from the end of the pre-hook (the reductions finished) to the
   optimizer's return, before the post-hook issues (or waits for) any all-gather.

``no_sync()`` accumulates in ``param.grad`` without communication (DDP's contract); the first
backward outside it reduces the sum once. Frozen parameters (``requires_grad=False`` at
construction) are in no bucket and never stepped; changing trainability later is refused at the
next step (wrap again). ``model.clip_grad_norm_(max_norm)`` between backward and step clips as
``torch.nn.utils.clip_grad_norm_`` on DDP's gradients (:mod:`zero_lab.engine.clip`). With bf16 / fp16
parameters the optimizer steps fp32 main copies of the owned ranges, fed the reduced gradients in fp32
(:mod:`zero_lab.engine.main_params`); a forward under ``torch.autocast`` needs nothing more. ``Join`` is
refused. Differences from DDP + the same optimizer: none in
the parameters (bitwise at W=2 for Adam, AdamW and SGD, tested), except that a parameter no rank's
gradient reaches is stepped with a zero gradient (DDP skips it): plain Adam and SGD leave it
unchanged, weight decay still applies.
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zero_lab import host_shm
from zero_lab.chained import ChainedOptimizer
from zero_lab.collectives import collective_named
from zero_lab.comm import INTER_GROUP, CommStats, Communicator
from zero_lab.elementwise import is_elementwise
from zero_lab.engine import clip
from zero_lab.engine.bucket_group import BucketGroup
from zero_lab.engine.buffer import ParamAndGradBuffer
from zero_lab.engine.layout import Bucket, cuts_elements, grad_hold_bound, plan_buckets
from zero_lab.engine.main_params import LOW_PRECISION, write_back
from zero_lab.engine.state import EngineStates
from zero_lab.engine.whole import drop_grads, hand_grads, owned_whole
from zero_lab.grad_reduce import grad_reduce_named
from zero_lab.hierarchy import hierarchy_of
from zero_lab.partition import Flat, ParamSpec, Partitioner, SortedGreedy

__all__ = [
    "BUCKET_CAP_MB",
    "MAILBOX_SLOTS",
    "SHM_MODES",
    "ShardedDataParallel",
    "default_modes",
    "engine_of",
    "mailbox_bytes",
]

#: The engine's default bucket cap: about a layer of a mid-sized model (12 × Linear(768) is 2.25 MiB a
#: layer), so the gradients held stay near Ψ/W (+ two buckets); DDP's 25 MiB would hold ten such layers.
BUCKET_CAP_MB = 4.0


#: Each re-pointed optimizer's engine (weakly: neither keeps the other alive through this table).
_ENGINES: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ReferenceType[ShardedDataParallel]] = (
    weakref.WeakKeyDictionary()
)


def engine_of(optimizer: torch.optim.Optimizer) -> ShardedDataParallel | None:
    """The engine that re-pointed ``optimizer`` (code that holds only the optimizer, e.g. the app's
    strategy, settles the parameters through it), or ``None``."""
    ref = _ENGINES.get(optimizer)
    return ref() if ref is not None else None


def default_modes(backend: str, device: str = "cpu") -> tuple[str, str]:
    """``(grad_reduce, exchange)`` for a backend and the parameters' device type, where host shared memory
    is not used (the engine tries it first on Gloo with CPU tensors: :data:`SHM_MODES`): point-to-point on
    Gloo with CPU tensors (FIELD-NOTES: Gloo's reduce-scatter and all-gather tensors are several
    times slower), the native collectives on NCCL, and Gloo's all-reduce and broadcasts for CUDA
    tensors over Gloo (its point-to-point sends take host memory only)."""
    if backend == "nccl":
        return "reduce_scatter_native", "all_gather"
    if device != "cpu":
        return "all_reduce", "broadcast"
    return "reduce_scatter", "p2p_all_gather"


#: The default modes when every rank of the shard group is on one x86-64 host with CPU tensors over Gloo:
#: the point-to-point algorithms through shared-memory mailboxes (:mod:`zero_lab.host_shm`; bitwise the
#: same sums, DDP's bytes), the engine's fastest mode on one host (docs/benchmarks.md).
SHM_MODES = ("shm_reduce_scatter", "shm_all_gather")
#: Slots of the engine's mailbox: a rank posting message ``s`` waits for its peers to have read ``s - 4``,
#: so ranks run at most four bucket collectives apart. Each slot is resident memory on every rank that
#: maps it: on 12 × Linear(768) at W=2 four slots hold 23 MiB less per rank than a slot per bucket, for
#: 0.02 × DDP's step (0.560-0.562 against 0.540-0.542, docs/benchmarks.md).
MAILBOX_SLOTS = 4


class ShardedDataParallel(nn.Module):
    """Wrap ``module`` for data parallelism with ZeRO-2, stepping ``optimizer`` on this rank's shards.

    Args:
        module: the model, identical in structure on every rank.
        optimizer: an elementwise ``torch.optim`` optimizer over ``module``'s parameters, not yet
            stepped; it is re-pointed at this rank's ranges (see the module docstring).
        partitioner: who owns what (:mod:`zero_lab.partition`); ``Flat()`` (the default) cuts
            every bucket evenly, a whole-parameter partitioner names each parameter's owner and
            the bucket is laid out owner by owner. Flat's own ``bucket_cap_mb`` is not used: the
            engine's is.
        grad_reduce: a registered ``grad_reduce`` strategy; ``None``: on Gloo with CPU tensors,
            ``shm_reduce_scatter`` when every rank of the shard group is on one x86-64 host and its
            mailboxes can be set up, else point-to-point (:attr:`transport_note` says why);
            ``reduce_scatter_native`` on NCCL (:func:`default_modes`). ``all_reduce`` is the control.
            Every buffer lives on the parameters' device.
        exchange: a registered parameter collective; ``None``: ``shm_all_gather`` where ``grad_reduce``'s
            default goes through shared memory, else as :func:`default_modes`.
        prefetch: gather parameters behind the next forward (``True``) or inside ``step()``.
        bucket_cap_mb: the bucket size cap (a module larger than it gets a bucket of its own).
        process_group: the data-parallel group (default: the world).
        shard_size: own the state in groups of this many consecutive ranks, replicated across the
            groups (:mod:`zero_lab.hierarchy`; ``None``: one group of all; ``"node"``: a node's
            ranks): gradients are reduced inside the group, then each owned range across the
            replicas, and parameters gathered inside the group. It must divide the group's size;
            every rank of the world wraps.
        broadcast_buffers: broadcast rank 0's module buffers before every forward, as DDP does.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        partitioner: Partitioner | None = None,
        grad_reduce: str | None = None,
        exchange: str | None = None,
        prefetch: bool = True,
        bucket_cap_mb: float = BUCKET_CAP_MB,
        process_group: Any = None,
        broadcast_buffers: bool = True,
        shard_size: int | str | None = None,
    ):
        super().__init__()
        self.module = module
        self.optimizer = optimizer
        self.hierarchy = hierarchy_of(process_group, shard_size, tag="engine")
        self.comm = Communicator(self.hierarchy.shard_group)  # the gradient reduction (and the set-up broadcasts)
        self.param_comm = Communicator(self.hierarchy.shard_group)  # the parameter all-gathers, metered apart
        replicas, self.dp_comm = None, self.comm
        if self.hierarchy.hierarchical:  # the replicas' all-reduce, and rank 0's broadcasts to every group
            replicas = Communicator(self.hierarchy.replica_group, stats=self.comm.stats, link=INTER_GROUP)
            self.dp_comm = Communicator(process_group, stats=self.comm.stats, link=INTER_GROUP)
        backend = dist.get_backend(self.comm.group)
        device = next((p.device.type for p in module.parameters()), "cpu")
        default_reduce, default_exchange = default_modes(backend, device)
        self.grad_reduce = grad_reduce or default_reduce
        self.exchange = exchange or default_exchange
        self.prefetch = prefetch
        self.bucket_cap_mb = bucket_cap_mb
        self.broadcast_buffers = broadcast_buffers
        names, params, groups, whole_groups = _check_optimizer(module, optimizer)
        self.partitioner = partitioner if partitioner is not None else SortedGreedy() if whole_groups else Flat()
        whole = {i for i, p in enumerate(params) if groups.get(id(p)) in whole_groups}
        _check_whole(whole, params, names, self.partitioner)
        specs = [
            ParamSpec.of(p, name=n, group=groups.get(id(p), 0), elementwise=i not in whole)
            for i, (n, p) in enumerate(zip(names, params))
        ]
        self.buckets: tuple[Bucket, ...] = plan_buckets(specs, self.comm.world_size, self.partitioner, bucket_cap_mb)
        #: why a default mode does not go through host shared memory ("" where it does, or none is a default)
        self.transport_note = ""
        self._mailboxes = False
        if backend == "gloo" and device == "cpu" and self.comm.world_size > 1 and None in (grad_reduce, exchange):
            try:
                _attach_host_shm(self.buckets, self.comm)
            except host_shm.Refused as refused:  # on every rank alike: the checks are collective
                self.transport_note = f"host shared memory refused, over Gloo: {refused}"
            else:
                self._mailboxes = True
                self.grad_reduce = grad_reduce or SHM_MODES[0]
                self.exchange = exchange or SHM_MODES[1]
        named = (grad_reduce_named(self.grad_reduce), collective_named(self.exchange))
        if not self._mailboxes and self.comm.world_size > 1 and any(map(host_shm.uses_host_shm, named)):
            _attach_host_shm(self.buckets, self.comm)  # asked for by name: a refusal is the error
            self._mailboxes = True
        self._all_params = tuple(module.parameters())
        self._trainable = [p.requires_grad for p in self._all_params]  # checked at every step
        self._sync_module_states(params)
        self.buffer = ParamAndGradBuffer(params, self.buckets, self.comm.rank)
        self.group = BucketGroup(
            self.buffer,
            self.comm,
            grad_reduce_named(self.grad_reduce),
            collective_named(self.exchange),
            self.param_comm,
            replicas,
        )
        #: each param group's parameters as given (checkpoints name the state by them: :mod:`~zero_lab.engine.state`)
        self.group_params = [list(group["params"]) for group in optimizer.param_groups]
        self._whole = owned_whole(self.buffer, self.comm.rank, whole)  # Muon's matrices this rank owns
        mine = {id(params[w.param]) for w in self._whole}
        for index, group in enumerate(optimizer.param_groups):
            group["params"] = (
                [p for p in group["params"] if id(p) in mine]
                if index in whole_groups
                else [
                    owned for b, owned in zip(self.buckets, self.buffer.main) if b.group == index and owned is not None
                ]
            )
        self._sync = True
        #: running seconds of the optimizer's step on this rank's ranges (no reduction, no all-gather)
        self.local_step_seconds = 0.0
        self._step_started = 0.0
        self._handles = [
            self.buffer.params[i].register_post_accumulate_grad_hook(self._grad_hook)
            for b in self.buckets
            for i in b.params
        ]
        self._handles.append(optimizer.register_step_pre_hook(self._before_step))
        self._handles.append(optimizer.register_step_post_hook(self._after_step))
        if prefetch:
            self._handles += _wait_hooks(module, self.buffer, self.group)
        self._closed = False
        _ENGINES[optimizer] = weakref.ref(self)
        closer = weakref.WeakMethod(self.close)
        self._atexit = lambda: (lambda close: close() if close is not None else None)(closer())
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ the loop
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.dp_comm.world_size > 1:
            self.dp_comm.broadcast_many([(b, 0) for b in self.module.buffers()], op="engine_buffers")
        out = self.module(*args, **kwargs)
        self.group.wait_buckets(
            range(len(self.buckets))
        )  # a bucket no module waited for (a parameter used by a parent)
        return out

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates into ``param.grad`` without communication; the first backward
        after it reduces the sum (DDP's contract)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _grad_hook(self, param: torch.Tensor) -> None:
        if self._sync:
            self.group.grad_ready(param)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._finish_grads()
        hand_grads(self.buffer, self._whole)
        self._step_started = time.perf_counter()  # the local step: from here to the optimizer's return

    def _finish_grads(self) -> None:
        """Finish this backward's reductions (idempotent): the owned gradients are then whole."""
        self._check_trainable()
        if not self.group.started and any(
            self.buffer.params[i].grad is not None for b in self.buckets for i in b.params
        ):
            raise RuntimeError(
                "ShardedDataParallel: step() after backward only inside no_sync(): gradients were accumulated "
                "but never reduced; run the last micro-batch's backward outside model.no_sync()"
            )
        self.group.finish_grad_sync()

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.local_step_seconds += time.perf_counter() - self._step_started
        drop_grads(self.buffer, self._whole)
        write_back(self.buffer.owned, self.buffer.main)
        self.group.start_param_sync()
        if not self.prefetch:
            self.group.wait_all()

    def _check_trainable(self) -> None:
        if [p.requires_grad for p in self._all_params] != self._trainable:
            raise RuntimeError(
                "ShardedDataParallel: the set of parameters with requires_grad changed after construction; "
                "wrap the model again (and build a new optimizer) after freezing or unfreezing parameters"
            )

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> torch.Tensor:
        """Clip the gradients to a global norm of ``max_norm`` as ``torch.nn.utils.clip_grad_norm_`` would
        on DDP's, from the owned gradients with one all-reduce (:mod:`zero_lab.engine.clip`); returns the
        total norm. Call it between ``backward()`` and ``step()``: it finishes the reductions first."""
        self._finish_grads()
        return clip.clip_grad_norm_(self.buffer, self.comm, max_norm, norm_type, error_if_nonfinite)

    def states(self) -> EngineStates:
        """The optimizer's state per module parameter: what checkpoints save and load
        (:class:`~zero_lab.engine.state.EngineStates`; its ``full_state_dict()`` is torch's format)."""
        return EngineStates(self)

    # ------------------------------------------------------------------ what it holds
    def wait_for_params(self) -> None:
        """Wait for the parameter all-gathers in flight (before reading parameters outside forward)."""
        self.group.wait_buckets(range(len(self.buckets)))

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self.wait_for_params()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for the gathers in flight first: one landing after the load would overwrite it."""
        self.wait_for_params()
        return super().load_state_dict(*args, **kwargs)

    @property
    def comm_stats(self) -> CommStats:
        """Every collective of the engine so far: gradient reductions and parameter all-gathers together."""
        return self.comm.stats.plus(self.param_comm.stats)

    def grad_hold_bound(self) -> int:
        """The most gradient bytes this rank may hold during a step: owned + two largest buckets."""
        return grad_hold_bound(self.buckets, self.comm.rank)

    @property
    def peak_grad_bytes(self) -> int:
        """The most gradient bytes this rank held at once so far, measured on the buffers."""
        return self.buffer.peak_grad_bytes

    def owned_params(self) -> list[bool]:
        """Per parameter of the module (registration order): whether this rank owns any of its elements."""
        owned = [False] * len(self.buffer.params)
        for bucket in self.buckets:
            start, stop = bucket.bounds[self.comm.rank]
            for index, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
                owned[index] = owned[index] or (offset < stop and offset + size > start)
        return owned

    def imbalance(self) -> float:
        """The fullest rank's owned elements over the mean (1.0: perfectly balanced)."""
        owned = [sum(b.owned_numel(r) for b in self.buckets) for r in range(self.comm.world_size)]
        return max(owned) * len(owned) / max(sum(owned), 1)

    def modes(self) -> dict[str, Any]:
        """What runs: the closing lines and the benchmark print it."""
        return {
            "engine": "zero_lab",
            "grad_reduce": self.grad_reduce,
            "exchange": self.exchange,
            "prefetch": self.prefetch,
            "partitioner": repr(self.partitioner),
            "buckets": len(self.buckets),
            "bucket_cap_mb": self.bucket_cap_mb,
            "peak_grad_bytes": self.peak_grad_bytes,
            "grad_hold_bound": self.grad_hold_bound(),
            "shard_size": self.hierarchy.shard_size,
            "transport_note": self.transport_note,
        }

    def join_hook(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ShardedDataParallel does not support torch.distributed.algorithms.Join: a joined rank cannot "
            "shadow the point-to-point reductions; give every rank the same number of batches"
        )

    def close(self) -> None:
        """Wait for every collective in flight and remove the hooks; call before destroy_process_group()
        (also run at interpreter exit)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        if dist.is_initialized():
            self.group.wait_all()
        if self._mailboxes:
            self._mailboxes = False
            host_shm.release(self.comm)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> ShardedDataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _sync_module_states(self, params: list[torch.Tensor]) -> None:
        if self.dp_comm.world_size > 1:
            tensors = [p.detach() for p in params] + list(self.module.buffers())
            with torch.no_grad():
                self.dp_comm.broadcast_many([(t, 0) for t in tensors], op="engine_init_broadcast")


def _check_optimizer(
    module: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[list[str], list[torch.Tensor], dict[int, int], set[int]]:
    """``module``'s parameter names and tensors, each optimizer parameter's group index, and the groups
    whose class steps whole matrices (Muon in a :class:`~zero_lab.ChainedOptimizer`); errors name the problem."""
    classes = (
        optimizer.group_classes()
        if isinstance(optimizer, ChainedOptimizer)
        else [type(optimizer)] * len(optimizer.param_groups)
    )
    whole_groups = {index for index, cls in enumerate(classes) if not is_elementwise(cls)}  # stepped whole
    if optimizer.state:
        raise ValueError("ShardedDataParallel needs an optimizer that has not stepped yet (its state is not empty)")
    named = list(module.named_parameters())
    groups = {id(p): index for index, group in enumerate(optimizer.param_groups) for p in group["params"]}
    known = {id(p) for _, p in named}
    stray = [i for i, g in enumerate(optimizer.param_groups) for p in g["params"] if id(p) not in known]
    if stray:
        raise ValueError(f"the optimizer's param group {stray[0]} holds a tensor that is not a parameter of the module")
    missing = [n for n, p in named if p.requires_grad and id(p) not in groups]
    if missing:
        raise ValueError(f"parameter {missing[0]!r} requires grad but is in no param group of the optimizer")
    return [n for n, _ in named], [p for _, p in named], groups, whole_groups


def _check_whole(whole: set[int], params: list[torch.Tensor], names: list[str], partitioner: Partitioner) -> None:
    """Whole matrices need a partitioner that keeps each parameter on one rank, and fp32 or fp64 (the main
    copies of bf16 ranges are elementwise)."""
    if whole and cuts_elements(partitioner):
        raise ValueError(
            f"partitioner {partitioner!r} cuts parameters into element ranges, but {names[min(whole)]!r} is stepped "
            "whole (a Muon group); use a whole-parameter partitioner: SortedGreedy() (the default then), Manual"
        )
    low = [names[i] for i in sorted(whole) if params[i].dtype in LOW_PRECISION]
    if low:
        raise ValueError(
            f"parameter {low[0]!r} is {params[min(whole)].dtype} and stepped whole (a Muon group): the engine keeps "
            "fp32 main copies of element ranges only; train those matrices in fp32"
        )


def _attach_host_shm(buckets: Sequence[Bucket], comm: Communicator) -> None:
    """Set up the shard group's shared-memory mailboxes (:mod:`zero_lab.host_shm`, a collective):
    :data:`MAILBOX_SLOTS` slots, each the largest message of a bucket's reduce-scatter or all-gather;
    raises on every rank alike where they cannot be (other hosts, not x86-64, no room in /dev/shm)."""
    host_shm.attach(comm, slots=MAILBOX_SLOTS, slot_bytes=_slot_bytes(buckets, comm.world_size))


def _slot_bytes(buckets: Sequence[Bucket], world_size: int) -> int:
    return host_shm.slot_bytes_for([[b.owned_numel(r) * b.itemsize for r in range(world_size)] for b in buckets])


def mailbox_bytes(buckets: Sequence[Bucket], world_size: int) -> int:
    """Bytes of one rank's mailbox as the engine sizes it (the memory plan's term, :mod:`zero_lab.peak`)."""
    return host_shm.mailbox_bytes(MAILBOX_SLOTS, _slot_bytes(buckets, world_size))


def _wait_hooks(module: nn.Module, buffer: ParamAndGradBuffer, group: BucketGroup) -> list[Any]:
    """Forward pre-hooks: each module waits for the buckets of its own parameters (forward order)."""
    handles = []
    for sub in module.modules():
        buckets = sorted({buffer.where[id(p)][0] for p in sub.parameters(recurse=False) if id(p) in buffer.where})
        if buckets:
            handles.append(sub.register_forward_pre_hook(lambda *_, wanted=tuple(buckets): group.wait_buckets(wanted)))
    return handles
