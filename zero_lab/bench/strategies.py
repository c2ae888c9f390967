"""The strategies the benchmark compares: a plain mapping from name to builder.

Every strategy trains the same model copy with Adam(lr 1e-3) and differs only in how
the data-parallel state is held and moved:

* ``ddp`` — DDP (Gloo, default buckets) + Adam; ``ddp_aa`` the same again, the A/A
  control whose ratio to ``ddp`` *is* the noise;
* ``torch`` / ``torch_bv`` — torch's ``ZeroRedundancyOptimizer`` in DDP
  (``parameters_as_bucket_view`` off / on); ``fairscale_oss`` — FairScale's ``OSS``;
* ``zl_*`` — zero_lab in DDP: sorted-greedy / flat partition, ``_bv`` = bucket view
  (``exchange="auto"``: the collective chosen by timing both at the first step; its
  report is recorded), ``zl_flat_bv_bc`` / ``zl_flat_bv_ag`` the same with
  ``exchange="broadcast"`` / ``"all_gather"`` forced, ``zl_prefetch`` = zero_lab's best
  setting (flat cut into :data:`PREFETCH_BUCKET_CAP_MB` MiB buffers, bucket view, auto,
  :func:`~zero_lab.overlap.prefetch_exchange`: the exchange issued by ``step()``, each
  layer's forward waiting only for its own buffer), and the overlap
  hooks (``hook_with_zero_step``, interleaved);
* ``zl_gr_<grad>_<exchange>`` — zero_lab with its gradient reduction
  (:func:`zero_lab.grad_reduce.reduce_gradients`): flat partition, bucket view, each bucket's
  gradients reduced to their owners by ``ar`` (all_reduce: DDP's traffic, through the hook),
  ``rs`` (point-to-point reduce-scatter) or ``rsn`` (native ``reduce_scatter_tensor``), then
  the exchange by ``bc`` (broadcast), ``ag`` (all_gather) or ``p2p`` (the point-to-point
  all-gather, ``p2p_all_gather``); ``zl_gr_auto`` lets both phases
  choose; ``zl_gr_prefetch`` is ``zl_prefetch`` with the reduce-scatter; ``zl_gr_shard`` adds
  ``release_grads=True`` (unowned gradients released after backward); ``zl_gr_rs_bc_s2`` is ``zl_gr_rs_bc`` sharded
  hierarchically over groups of 2 ranks (``shard_size=2``: 2 × 2 at W=4, :mod:`zero_lab.hierarchy`;
  the whole world where 2 does not divide W). Their reference is ``ddp``;
* ``fsdp2`` / ``fsdp2_reshard`` — ``torch.distributed.fsdp.fully_shard`` on every block
  and at the root, ``reshard_after_forward=False`` (ZeRO-2-like: sharded gradients and
  state, parameters kept gathered from forward to backward) / ``True`` (ZeRO-3-like);
* ``deepspeed_z1`` / ``deepspeed_z2`` — DeepSpeed's ZeRO stage 1 / 2 (the optional ``[bench]``
  peer; left out, and the header says why, where it does not import): on CPU
  (``DS_ACCELERATOR=cpu``, its communication on the same Gloo world), the client optimizer
  ``torch.optim.Adam`` (``zero_allow_untested_optimizer``), fp32, ``engine.backward`` and
  ``engine.step``. Their reference is ``ddp``.

``Strategy.reference`` is the strategy a row's "÷ torch" ratio is taken against (the
torch setup at equal settings); ``family`` groups strategies the round planner keeps
together::

    runner = STRATEGIES["zl_flat_bv"].build(template)   # a fresh copy of template
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.bench.stepper import Runner
from zero_lab.bench.workloads import blocks_of
from zero_lab.grad_reduce import reduce_gradients
from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved, prefetch_exchange
from zero_lab.partition import Flat, Partitioner, SortedGreedy

__all__ = ["LR", "STRATEGIES", "Strategy", "deepspeed_status", "fairscale_status", "imbalance", "shard_at"]

LR = 1e-3
#: zl_prefetch's Flat buffer cap, MiB: buffers never split a module, so this is one per layer (or module)
PREFETCH_BUCKET_CAP_MB = 1.0


@dataclass(frozen=True)
class Strategy:
    """One setup; ``build(template)`` returns a :class:`Runner` over a fresh copy of ``template``.

    ``partitioner`` is what the planner prices this strategy's state with (``None``:
    every rank holds the whole state; FSDP2 rows are not planned); ``transient`` says
    its exchange stages through a fresh model-sized buffer (the memory guard's margin);
    ``exchange_in_step`` says the parameter exchange happens inside ``optimizer.step()``
    (so step − local step is its time); ``sharded`` is False for the replicated rows.
    """

    name: str
    label: str
    build: Callable[[nn.Module], Runner]
    reference: str | None = None
    family: str | None = None
    zero_lab: bool = False
    partitioner: Callable[[], Partitioner] | None = None
    planned: bool = True
    transient: bool = False
    exchange_in_step: bool = True
    sharded: bool = True
    shard_size: int | None = None

    def shard_at(self, world_size: int) -> int:
        """The ranks the state is sharded over at ``world_size`` (:func:`shard_at`)."""
        return shard_at(self.shard_size, world_size)

    @property
    def group(self) -> str:
        """The family the round planner keeps together (the strategy alone by default)."""
        return self.family or self.name


def shard_at(shard_size: int | None, world_size: int) -> int:
    """``shard_size`` where it divides ``world_size``, else the whole world (``None``: the whole world)."""
    return shard_size if shard_size and world_size % shard_size == 0 else world_size


def imbalance(per_rank: list[int]) -> float:
    """Max / ideal elements per rank."""
    ideal = sum(per_rank) / len(per_rank)
    return max(per_rank) / ideal if ideal else 1.0


def _numel(groups: list[dict[str, Any]]) -> int:
    return sum(p.numel() for g in groups for p in g["params"])


def _ddp(template: nn.Module) -> Runner:
    model = copy.deepcopy(template)
    ddp = DDP(model)
    adam = torch.optim.Adam(ddp.parameters(), lr=LR)
    return Runner(model, ddp, adam, adam)


def _torch_zero(bucket_view: bool) -> Callable[[nn.Module], Runner]:
    def build(template: nn.Module) -> Runner:
        model = copy.deepcopy(template)
        ddp = DDP(model)
        zero = TorchZero(ddp.parameters(), torch.optim.Adam, parameters_as_bucket_view=bucket_view, lr=LR)
        balance = imbalance([_numel(groups) for groups in zero._partition_parameters()])
        return Runner(model, ddp, zero, zero.optim, imbalance=balance)

    return build


def _fairscale_oss(template: nn.Module) -> Runner:
    from fairscale.optim import OSS  # optional peer: `make bench-deps`

    model = copy.deepcopy(template)
    ddp = DDP(model)
    oss = OSS(ddp.parameters(), optim=torch.optim.Adam, lr=LR)
    balance = imbalance([_numel(groups) for groups in oss.partition_parameters()])
    return Runner(model, ddp, oss, oss.optim, imbalance=balance)


def _deepspeed(stage: int) -> Callable[[nn.Module], Runner]:
    """DeepSpeed ZeRO ``stage`` (1 or 2) over the bench's Gloo world, fp32, client ``torch.optim.Adam``."""

    def build(template: nn.Module) -> Runner:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when deepspeed is first imported
        import deepspeed  # optional peer: the [bench] extra

        deepspeed.init_distributed(dist_backend="gloo")  # adopts the world already initialised
        model = copy.deepcopy(template)
        client = torch.optim.Adam(model.parameters(), lr=LR)
        config = {
            "train_micro_batch_size_per_gpu": 1,  # the bench feeds the batches; this only sizes DeepSpeed's counters
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30,
        }
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config)
        return Runner(model, engine, _DeepSpeedStep(engine), client, backward=engine.backward)

    return build


class _DeepSpeedStep:
    """The bench's ``optimizer`` for a DeepSpeed engine: ``step`` is ``engine.step()`` (which also
    zeroes the gradients), ``zero_grad`` the engine's."""

    def __init__(self, engine: Any):
        self.engine = engine

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()


def deepspeed_status() -> tuple[bool, str]:
    """Whether DeepSpeed imports here (on CPU), and its version or the error."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except Exception as error:  # ImportError, or an accelerator / build problem raised at import
        return False, f"not importable ({type(error).__name__}: {error}); pip install 'zero_lab[bench]' installs it"
    return True, f"deepspeed {deepspeed.__version__}"


def _zero_lab(
    partitioner: Callable[[], Partitioner], bucket_view: bool, **kwargs: Any
) -> Callable[[nn.Module], Runner]:
    def build(template: nn.Module) -> Runner:
        model = copy.deepcopy(template)
        ddp = DDP(model)
        zero = ZeroRedundancyOptimizer(
            ddp.parameters(),
            torch.optim.Adam,
            parameters_as_bucket_view=bucket_view,
            partitioner=partitioner(),
            lr=LR,
            **kwargs,
        )
        return _zero_lab_runner(model, ddp, zero)

    return build


def _zero_lab_runner(model: nn.Module, ddp: DDP, zero: ZeroRedundancyOptimizer, **kwargs: Any) -> Runner:
    kwargs.setdefault("report", lambda: zero.exchange_report().as_dict())
    return Runner(
        model,
        ddp,
        zero,
        zero.optim,
        comm_stats=lambda: zero.comm_stats,
        imbalance=zero.partition.report().imbalance,
        **kwargs,
    )


def _zero_lab_prefetch(template: nn.Module) -> Runner:
    """Flat in several buffers, bucket view, ``exchange="auto"``, the exchange hidden behind the next forward."""
    model = copy.deepcopy(template)
    ddp = DDP(model)
    zero = ZeroRedundancyOptimizer(
        model.named_parameters(),  # names: buffers keep each module whole
        torch.optim.Adam,
        parameters_as_bucket_view=True,
        partitioner=Flat(bucket_cap_mb=PREFETCH_BUCKET_CAP_MB),
        lr=LR,
    )
    handle = prefetch_exchange(model, zero)
    return _zero_lab_runner(
        model, ddp, zero, step_deferred=True, settle=zero.wait_for_exchange, on_close=[handle.remove]
    )


def _zero_lab_overlap(interleaved: bool) -> Callable[[nn.Module], Runner]:
    def build(template: nn.Module) -> Runner:
        model = copy.deepcopy(template)
        ddp = DDP(model)
        zero = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=LR)
        make_hook = hook_with_zero_step_interleaved if interleaved else hook_with_zero_step
        ddp.register_comm_hook(None, make_hook(allreduce_hook, ddp, zero))
        return _zero_lab_runner(model, ddp, zero, steps_in_backward=True)

    return build


def _zero_lab_grads(
    grad_reduce: str, exchange: str, prefetch: bool = False, release_grads: bool = False, shard_size: int | None = None
) -> Callable[[nn.Module], Runner]:
    """Flat, bucket view, the gradients reduced to their owners (``grad_reduce``), ``exchange``; the
    state sharded over groups of ``shard_size`` ranks where that divides W (:func:`shard_at`)."""

    def build(template: nn.Module) -> Runner:
        model = copy.deepcopy(template)
        ddp = DDP(model)
        zero = ZeroRedundancyOptimizer(
            model.named_parameters(),
            torch.optim.Adam,
            parameters_as_bucket_view=True,
            partitioner=Flat(bucket_cap_mb=PREFETCH_BUCKET_CAP_MB) if prefetch else Flat(),
            exchange=exchange,
            shard_size=shard_at(shard_size, dist.get_world_size()),
            lr=LR,
        )
        reducer = reduce_gradients(ddp, zero, grad_reduce, release_grads=release_grads)

        def report() -> dict[str, Any]:
            return {**zero.exchange_report().as_dict(), "grad_reduce": reducer.report()}

        # shard_size < W: the replica all-reduce runs on the hook's worker thread, unseen by the profiler
        grad_stats = None if reducer.replicas is None else (lambda: reducer.stats)
        if not prefetch:
            return _zero_lab_runner(model, ddp, zero, report=report, on_close=[reducer.close], grad_stats=grad_stats)
        handle = prefetch_exchange(model, zero)
        return _zero_lab_runner(
            model,
            ddp,
            zero,
            report=report,
            step_deferred=True,
            settle=zero.wait_for_exchange,
            on_close=[handle.remove, reducer.close],
        )

    return build


_GRAD_NAMES = {"ar": "all_reduce", "rs": "reduce_scatter", "rsn": "reduce_scatter_native"}
_EXCHANGE_NAMES = {"bc": "broadcast", "ag": "all_gather", "p2p": "p2p_all_gather"}


def _grad_rows() -> list[Strategy]:
    rows = [
        Strategy(
            f"zl_gr_{g}_{e}",
            f"zero_lab flat, bucket view, grad_reduce={grad}, exchange={exchange}",
            _zero_lab_grads(grad, exchange),
            "ddp",
            "zl_gr",
            True,
            Flat,
        )
        for g, grad in _GRAD_NAMES.items()
        for e, exchange in _EXCHANGE_NAMES.items()
    ]
    rows += [
        Strategy(
            "zl_gr_rs_bc_s2",
            "zero_lab flat, bucket view, grad_reduce=reduce_scatter, exchange=broadcast, shard_size=2 (2 × 2 at W=4)",
            _zero_lab_grads("reduce_scatter", "broadcast", shard_size=2),
            "ddp",
            "zl_gr",
            True,
            None,  # the planner prices a partition over W: priced as DDP (an upper bound) instead
            planned=False,
            shard_size=2,
        ),
        Strategy(
            "zl_gr_auto",
            "zero_lab flat, bucket view, grad_reduce=auto, exchange=auto",
            _zero_lab_grads("auto", "auto"),
            "ddp",
            "zl_gr",
            True,
            Flat,
        ),
        Strategy(
            "zl_gr_shard",
            "zero_lab flat, bucket view, grad_reduce=reduce_scatter, release_grads=True, exchange=broadcast",
            _zero_lab_grads("reduce_scatter", "broadcast", release_grads=True),
            "ddp",
            "zl_gr",
            True,
            Flat,
        ),
        Strategy(
            "zl_gr_prefetch",
            f"zero_lab flat in ≤{PREFETCH_BUCKET_CAP_MB:g} MiB buffers, bucket view, grad_reduce=reduce_scatter, "
            "exchange=broadcast, prefetch_exchange",
            _zero_lab_grads("reduce_scatter", "broadcast", prefetch=True),
            "ddp",
            "zl_gr",
            True,
            functools.partial(Flat, bucket_cap_mb=PREFETCH_BUCKET_CAP_MB),
            exchange_in_step=False,
        ),
    ]
    return rows


def _fsdp2(reshard_after_forward: bool) -> Callable[[nn.Module], Runner]:
    def build(template: nn.Module) -> Runner:
        model = copy.deepcopy(template)
        for block in blocks_of(model):
            fully_shard(block, reshard_after_forward=reshard_after_forward)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        adam = torch.optim.Adam(model.parameters(), lr=LR)
        return Runner(model, model, adam, adam)

    return build


def fairscale_status() -> tuple[bool, str]:
    """Whether FairScale's OSS imports with this torch, and its version or the error."""
    try:
        import fairscale
        from fairscale.optim import OSS  # noqa: F401
    except Exception as error:  # ImportError, or an incompatibility raised at import
        return False, f"not importable ({type(error).__name__}: {error}); `make bench-deps` installs it"
    return True, f"fairscale {fairscale.__version__}"


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("ddp", "DDP + Adam", _ddp, exchange_in_step=False, sharded=False),
        Strategy(
            "ddp_aa",
            "DDP + Adam again: the A/A control (its ÷ DDP is the noise)",
            _ddp,
            reference="ddp",
            exchange_in_step=False,
            sharded=False,
        ),
        Strategy("torch", "torch ZeRO", _torch_zero(False), family="torch", partitioner=SortedGreedy),
        Strategy("torch_bv", "torch ZeRO, bucket view", _torch_zero(True), family="torch", partitioner=SortedGreedy),
        Strategy("fairscale_oss", "FairScale OSS", _fairscale_oss, reference="torch_bv", planned=False),
        Strategy(
            "zl_sg", "zero_lab sorted_greedy", _zero_lab(SortedGreedy, False), "torch", "zl_sg", True, SortedGreedy
        ),
        Strategy(
            "zl_sg_bv",
            "zero_lab sorted_greedy, bucket view",
            _zero_lab(SortedGreedy, True),
            "torch_bv",
            "zl_sg",
            True,
            SortedGreedy,
        ),
        Strategy("zl_flat", "zero_lab flat", _zero_lab(Flat, False), "torch", "zl_flat", True, Flat, transient=True),
        Strategy(
            "zl_flat_bv",
            "zero_lab flat, bucket view, exchange=auto",
            _zero_lab(Flat, True),
            "torch_bv",
            "zl_flat",
            True,
            Flat,
        ),
        Strategy(
            "zl_flat_bv_bc",
            "zero_lab flat, bucket view, exchange=broadcast",
            _zero_lab(Flat, True, exchange="broadcast"),
            "torch_bv",
            "zl_exchange",
            True,
            Flat,
        ),
        Strategy(
            "zl_flat_bv_ag",
            "zero_lab flat, bucket view, exchange=all_gather",
            _zero_lab(Flat, True, exchange="all_gather"),
            "torch_bv",
            "zl_exchange",
            True,
            Flat,
        ),
        Strategy(
            "zl_prefetch",
            f"zero_lab's best setting: flat in ≤{PREFETCH_BUCKET_CAP_MB:g} MiB buffers (whole modules), "
            "bucket view, exchange=auto, prefetch_exchange",
            _zero_lab_prefetch,
            "torch_bv",
            "zl_prefetch",
            True,
            functools.partial(Flat, bucket_cap_mb=PREFETCH_BUCKET_CAP_MB),
            exchange_in_step=False,
        ),
        Strategy(
            "zl_overlap",
            "zero_lab overlap (hook_with_zero_step)",
            _zero_lab_overlap(False),
            "torch_bv",
            "zl_overlap",
            True,
            planned=False,
            transient=True,
            exchange_in_step=False,
        ),
        Strategy(
            "zl_overlap_il",
            "zero_lab overlap (interleaved hook)",
            _zero_lab_overlap(True),
            "torch_bv",
            "zl_overlap",
            True,
            planned=False,
            transient=True,
            exchange_in_step=False,
        ),
        Strategy(
            "fsdp2",
            "FSDP2 fully_shard per block + root, reshard_after_forward=False (ZeRO-2-like)",
            _fsdp2(False),
            "torch_bv",
            "fsdp2",
            planned=False,
            exchange_in_step=False,
        ),
        Strategy(
            "fsdp2_reshard",
            "FSDP2 fully_shard per block + root, reshard_after_forward=True (ZeRO-3-like)",
            _fsdp2(True),
            "torch_bv",
            "fsdp2",
            planned=False,
            exchange_in_step=False,
        ),
        *_grad_rows(),
        Strategy(
            "deepspeed_z1",
            "DeepSpeed ZeRO-1 (CPU, Gloo), client torch.optim.Adam, fp32",
            _deepspeed(1),
            "ddp",
            "deepspeed",
            planned=False,
            transient=True,
        ),
        Strategy(
            "deepspeed_z2",
            "DeepSpeed ZeRO-2 (CPU, Gloo), client torch.optim.Adam, fp32",
            _deepspeed(2),
            "ddp",
            "deepspeed",
            planned=False,
            transient=True,
        ),
    )
}
