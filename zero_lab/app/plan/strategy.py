"""How a run keeps its optimizer state — plain DDP, ZeRO or the engine — as one typed object, not a flag.

Plain DDP: every rank holds and steps the whole optimizer state. ZeRO
(:class:`~zero_lab.ZeroRedundancyOptimizer`) and the engine (``dp=zero_lab``): each rank holds
and steps its shard's state, and the parameters are exchanged. Whatever the app does differently
for them (clipping, settling, checkpoints, reports, the closing lines) is a method here.

    strategy = Strategy.of(zero=plan.zero)        # PlainDdp() or Zero(); also Strategy.of(zero=summary.zero)
    norm = strategy.clip_grad_norm(model, optimizer, 1.0)
    strategy.settle(optimizer)                    # before a checkpoint or the final checksum
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from zero_lab import checkpoint as sharded
from zero_lab.chained import GROUP_CLASS_KEY, ChainedOptimizer
from zero_lab.engine import ShardedDataParallel, engine_of
from zero_lab.engine.layout import Bucket
from zero_lab.engine.main_params import main_copy_bytes
from zero_lab.optimizer import ZeroRedundancyOptimizer
from zero_lab.partition import PartitionReport
from zero_lab.shard_state import slice_state

__all__ = ["Engine", "PlainDdp", "Strategy", "Zero"]


class Strategy(ABC):
    """What differs between plain DDP and ZeRO, answered by the run's one strategy object."""

    #: Recorded as ``zero`` in summary.json, checkpoints and W&B (files keep their key).
    shards_state: ClassVar[bool]
    #: Top-level keys this strategy does not use (said once when a job starts).
    unused_keys: ClassVar[tuple[str, ...]]
    #: The W&B run's group names these config groups (the partitioner only where it shards).
    identity_groups: ClassVar[tuple[str, ...]]

    @staticmethod
    def of(zero: bool, dp: str = "ddp") -> Strategy:
        """The strategy of a run whose optimizer shards its state (``zero``) or not; ``dp="zero_lab"``: the engine's."""
        return ENGINE if dp == "zero_lab" else _BY_SHARDING[bool(zero)]

    @staticmethod
    def of_optimizer(optimizer: Optimizer) -> Strategy:
        """The strategy ``optimizer`` runs under: the engine's for one it re-pointed, else ZeRO's or plain DDP's."""
        zero = isinstance(optimizer, ZeroRedundancyOptimizer)
        return ENGINE if engine_of(optimizer) is not None else Strategy.of(zero)

    # ------------------------------------------------------------------ the optimizer's state
    def local_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """The ``torch.optim`` object that holds this rank's state."""
        return optimizer

    @abstractmethod
    def params_with_state(self, optimizer: Optimizer) -> list[bool]:
        """Per parameter of ``optimizer.param_groups`` (in order): whether this rank holds state for it."""

    def group_classes(self, optimizer: Optimizer) -> list[type]:
        """The class stepping each param group (a :class:`~zero_lab.ChainedOptimizer` names one per group)."""
        local = self.local_optimizer(optimizer)
        return (
            list(local.group_classes())
            if isinstance(local, ChainedOptimizer)
            else [type(local)] * len(local.param_groups)
        )

    def master_weight_bytes(self, optimizer: Optimizer) -> int:
        """Bytes of this rank's fp32 master shards (``optim.master_weights``; plain DDP keeps none)."""
        return 0

    # ------------------------------------------------------------------ the step
    @abstractmethod
    def clip_grad_norm(self, model: nn.Module, optimizer: Optimizer, max_norm: float) -> torch.Tensor:
        """Clip every gradient to a global norm of ``max_norm``; returns the norm before clipping."""

    @abstractmethod
    def settle(self, optimizer: Optimizer) -> None:
        """Finish any parameter exchange still in flight before the parameters are read whole."""

    # ------------------------------------------------------------------ what the run reports
    def imbalance(self, optimizer: Optimizer) -> float:
        """The fullest rank's share of the state over the mean (1.0: every rank holds all of it)."""
        return 1.0

    def partition_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        """The partition's report (``None``: nothing is partitioned)."""
        return None

    def exchange_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        """The parameter exchange's report (``None``: no exchange)."""
        return None

    def exchange_mode(self, optimizer: Optimizer) -> str | None:
        """The collective the exchange runs with (``None``: no exchange)."""
        return None

    def first_step_record(self, optimizer: Optimizer, mode_key: str) -> dict[str, Any]:
        """Metrics recorded after the first step: the exchange's mode under ``mode_key``, exchange=auto's timings."""
        return {}

    def engine_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        """``dp=zero_lab``: the engine's modes and gradient bytes (``None``: DDP trains)."""
        return None

    def of_exchange(self, figure: Any) -> Any:
        """``figure`` (a measurement of the parameter exchange) where there is an exchange, else ``None``."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, run_dir: str | Path, step: int) -> Path:
        """``<run_dir>/checkpoints/step_<step>``: a directory of shards (sharded), one ``.pt`` file (plain)."""
        return Path(run_dir) / "checkpoints" / f"step_{step:08d}{'' if self.shards_state else '.pt'}"

    @abstractmethod
    def save_checkpoint(self, path: Path, model: nn.Module, optimizer: Optimizer, whole: dict[str, Any]) -> None:
        """Write the checkpoint at ``path`` (on every rank). ``whole``: the plain file's entries
        besides the model and optimizer (step, losses, rng, ...), or the shards' manifest extras."""

    def load_sharded(self, directory: Path, model: nn.Module, optimizer: Optimizer) -> bool:
        """Load a sharded checkpoint into a ZeRO optimizer and the model; ``False``: not this
        strategy's to load (a plain optimizer takes the merged state instead)."""
        return False

    def group_params(self, optimizer: Optimizer) -> list[list[torch.Tensor]]:
        """Each param group's parameters as the model holds them (what a whole state dict is keyed by)."""
        return [list(group["params"]) for group in optimizer.param_groups]

    def load_whole_state(self, optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
        """Load a whole ``torch.optim`` state dict (a plain checkpoint's, or one merged from shards);
        each rank keeps what it steps."""
        optimizer.load_state_dict(state_dict)

    # ------------------------------------------------------------------ the closing lines
    @abstractmethod
    def state_line(
        self, held: float, ddp_bytes: float, world: int, imbalance: float, classes: str, size: Callable[[float], str]
    ) -> str:
        """The closing line's optimizer state per rank: sizes in bytes (worded by ``size``), ``classes``
        the stepping classes, ``imbalance`` the fullest rank over the mean."""

    @abstractmethod
    def exchange_line(self, exchange_share: str) -> str:
        """The closing line's parameter exchange (``exchange_share``: what ZeRO's exchange cost)."""


class PlainDdp(Strategy):
    """DDP + a ``torch.optim`` optimizer: every rank holds and steps the whole state."""

    shards_state = False
    unused_keys = ("partitioner", "bucket_view")
    identity_groups = ("optim", "model")

    def params_with_state(self, optimizer: Optimizer) -> list[bool]:
        return [bool(optimizer.state.get(p)) for group in optimizer.param_groups for p in group["params"]]

    def clip_grad_norm(self, model: nn.Module, optimizer: Optimizer, max_norm: float) -> torch.Tensor:
        """Every rank holds every (all-reduced) gradient: torch's clip, no communication."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def settle(self, optimizer: Optimizer) -> None:
        """Nothing is in flight: every rank stepped every parameter."""

    def save_checkpoint(self, path: Path, model: nn.Module, optimizer: Optimizer, whole: dict[str, Any]) -> None:
        """Rank 0 writes one file: the model, the whole optimizer state and ``whole``."""
        if torch.distributed.get_rank() != 0:
            return
        state = {
            "format": whole["format"],
            "step": whole["step"],
            "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            **{k: v for k, v in whole.items() if k not in ("format", "step")},
            "zero": False,
        }
        sharded.save_file(state, path)

    def state_line(
        self, held: float, ddp_bytes: float, world: int, imbalance: float, classes: str, size: Callable[[float], str]
    ) -> str:
        return f"{size(held)}, all of it on every rank (DDP + {classes}; a zero_* optimizer shards it)"

    def exchange_line(self, exchange_share: str) -> str:
        return "none (plain DDP: every rank steps every parameter)"


class _Sharded(Strategy):
    """What ZeRO and the engine share: each rank holds its shard's state, checkpoints are
    directories of shards (:mod:`zero_lab.checkpoint`), and the parameters are exchanged."""

    shards_state = True
    identity_groups = ("optim", "partitioner", "model")

    @abstractmethod
    def _states(self, optimizer: Optimizer) -> Any:
        """What :mod:`zero_lab.checkpoint` saves and loads the shards' state through."""

    def save_checkpoint(self, path: Path, model: nn.Module, optimizer: Optimizer, whole: dict[str, Any]) -> None:
        """Every rank writes its shard; the manifest carries ``whole``'s step, losses, world size, loop state."""
        extra = {k: v for k, v in whole.items() if k not in ("format", "model", "optimizer", GROUP_CLASS_KEY, "rng")}
        sharded.save_checkpoint(path, self._states(optimizer), model, extra=extra)

    def load_sharded(self, directory: Path, model: nn.Module, optimizer: Optimizer) -> bool:
        sharded.load_checkpoint(directory, self._states(optimizer), model)
        return True

    def state_line(
        self, held: float, ddp_bytes: float, world: int, imbalance: float, classes: str, size: Callable[[float], str]
    ) -> str:
        return (
            f"{size(held)} on the fullest of {world} rank(s) (imbalance {imbalance:.2f}); "
            f"DDP + the same {classes} would hold {size(ddp_bytes)} on every rank (planner): "
            f"÷ {ddp_bytes / max(held, 1):.2f}"
        )

    def exchange_line(self, exchange_share: str) -> str:
        return exchange_share

    def of_exchange(self, figure: Any) -> Any:
        return figure


class Zero(_Sharded):
    """:class:`~zero_lab.ZeroRedundancyOptimizer`: each rank holds and steps its shard's state."""

    unused_keys = ()

    def _states(self, optimizer: Optimizer) -> ZeroRedundancyOptimizer:
        return _zero(optimizer)

    def local_optimizer(self, optimizer: Optimizer) -> Optimizer:
        return _zero(optimizer).optim

    def group_classes(self, optimizer: Optimizer) -> list[type]:
        return list(_zero(optimizer).group_classes())

    def params_with_state(self, optimizer: Optimizer) -> list[bool]:
        """Each local shard's tensor looked up in the local optimizer's state."""
        zero = _zero(optimizer)
        held = [False] * sum(len(group["params"]) for group in zero.param_groups)
        for shard in zero.local_shards():
            held[shard.index] = held[shard.index] or bool(zero.optim.state.get(shard.tensor))
        return held

    def master_weight_bytes(self, optimizer: Optimizer) -> int:
        return _zero(optimizer).master_weight_bytes()

    def clip_grad_norm(self, model: nn.Module, optimizer: Optimizer, max_norm: float) -> torch.Tensor:
        """Each rank's norm of the elements it owns, one scalar all-reduce."""
        return _zero(optimizer).clip_grad_norm_(max_norm)

    def settle(self, optimizer: Optimizer) -> None:
        """``prefetch=true`` leaves the last step's exchange to the next forward: wait for it."""
        _zero(optimizer).wait_for_exchange()

    def imbalance(self, optimizer: Optimizer) -> float:
        return _zero(optimizer).partition.report().imbalance

    def partition_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        return _zero(optimizer).partition.report().as_dict()

    def exchange_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        return _zero(optimizer).exchange_report().as_dict()

    def exchange_mode(self, optimizer: Optimizer) -> str | None:
        return _zero(optimizer).exchange_mode

    def first_step_record(self, optimizer: Optimizer, mode_key: str) -> dict[str, Any]:
        """The exchange's mode and, with ``exchange=auto``, each candidate's measured time."""
        report = _zero(optimizer).exchange_report()
        record: dict[str, Any] = {mode_key: report.mode}
        record.update({f"comm/exchange_tune_s/{name}": seconds for name, seconds in report.timings_s.items()})
        return record

    def state_line(
        self, held: float, ddp_bytes: float, world: int, imbalance: float, classes: str, size: Callable[[float], str]
    ) -> str:
        """The sharded line, bounded: ``ddp_bytes`` is priced over the parameters that have state on
        some rank, so the fullest rank holds at least 1/W of it and a larger "÷" would be a measurement
        or planner error. (The engine has no such bound: it keeps one ``step`` per bucket, not per parameter.)"""
        assert ddp_bytes <= world * held * (1 + 1e-9), (
            f"DDP + {classes} priced at {ddp_bytes} B but the fullest of {world} rank(s) holds {held} B: a saving "
            "above the world size cannot be; the planner and the measurement disagree"
        )
        return super().state_line(held, ddp_bytes, world, imbalance, classes, size)


class Engine(_Sharded):
    """``dp=zero_lab``: :class:`~zero_lab.ShardedDataParallel` re-points a ``torch.optim`` optimizer at this
    rank's ranges of its buffers; state ≈ 1/W, gradients reduced per bucket, parameters gathered per bucket."""

    unused_keys = ("bucket_view", "overlap", "release_grads")

    def _states(self, optimizer: Optimizer) -> Any:
        """The engine's state per parameter (:mod:`zero_lab.engine.state`)."""
        return _engine(optimizer).states()

    def params_with_state(self, optimizer: Optimizer) -> list[bool]:
        """Per parameter of the wrapped module: whether this rank steps any of its elements."""
        return _engine(optimizer).owned_params() if optimizer.state else [False] * len(_engine(optimizer).buffer.params)

    def master_weight_bytes(self, optimizer: Optimizer) -> int:
        """The fp32 main copies of this rank's bf16 / fp16 ranges (:mod:`zero_lab.engine.main_params`)."""
        buffer = _engine(optimizer).buffer
        return main_copy_bytes(buffer.owned, buffer.main)

    def clip_grad_norm(self, model: nn.Module, optimizer: Optimizer, max_norm: float) -> torch.Tensor:
        """Each rank's norm of the gradients it owns, one all-reduce (:mod:`zero_lab.engine.clip`)."""
        return _engine(optimizer).clip_grad_norm_(max_norm)

    def settle(self, optimizer: Optimizer) -> None:
        """Wait for the parameter all-gathers still in flight (prefetch leaves the last step's to the next forward)."""
        _engine(optimizer).wait_for_params()

    def imbalance(self, optimizer: Optimizer) -> float:
        return _engine(optimizer).imbalance()

    def partition_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        """Each rank's owned elements and bytes over the engine's buckets (padding not counted)."""
        engine = _engine(optimizer)
        numel, nbytes = [], []
        for rank in range(engine.comm.world_size):
            owned = [(_owned_numel(b, rank), b.itemsize) for b in engine.buckets]
            numel.append(sum(n for n, _ in owned))
            nbytes.append(sum(n * size for n, size in owned))
        return PartitionReport(tuple(numel), tuple(nbytes), engine.imbalance()).as_dict()

    def exchange_mode(self, optimizer: Optimizer) -> str | None:
        return _engine(optimizer).exchange

    def engine_report(self, optimizer: Optimizer) -> dict[str, Any] | None:
        return _engine(optimizer).modes()

    def group_params(self, optimizer: Optimizer) -> list[list[torch.Tensor]]:
        """The module's parameters per group (the optimizer's groups hold this rank's views of the buckets)."""
        return [list(params) for params in _engine(optimizer).group_params]

    def load_whole_state(self, optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
        """Each parameter's whole state cut to the ranges this rank steps (:mod:`zero_lab.engine.state`), as a
        sharded checkpoint is loaded: a plain DDP + Adam checkpoint resumes on the engine."""
        states = _engine(optimizer).states()
        groups = state_dict["param_groups"]
        saved, mine = [len(g["params"]) for g in groups], [len(g["params"]) for g in states.param_groups]
        if saved != mine:
            raise ValueError(f"the state dict's param groups hold {saved} parameters, this optimizer's {mine}")
        keys = [key for group in groups for key in group["params"]]
        shapes = [p.shape for p in states.all_params]

        def state_of(index: int, start: int, stop: int) -> dict[str, Any] | None:
            whole = state_dict["state"].get(keys[index])
            return None if whole is None else slice_state(whole, shapes[index], start, stop)

        states.load_shard_states(state_of, groups)


_BY_SHARDING: dict[bool, Strategy] = {False: PlainDdp(), True: Zero()}
ENGINE = Engine()


def _owned_numel(bucket: Bucket, rank: int) -> int:
    """The elements of ``bucket``'s parameters in ``rank``'s range (its padding left out)."""
    start, stop = bucket.bounds[rank]
    return sum(
        max(0, min(stop, offset + size) - max(start, offset)) for offset, size in zip(bucket.offsets, bucket.sizes)
    )


def _engine(optimizer: Optimizer) -> ShardedDataParallel:
    engine = engine_of(optimizer)
    if engine is None:
        raise TypeError(f"the engine's strategy steps an optimizer ShardedDataParallel re-pointed, not {optimizer!r}")
    return engine


def _zero(optimizer: Optimizer) -> ZeroRedundancyOptimizer:
    """``optimizer`` as what it is under :class:`Zero`: a ZeroRedundancyOptimizer (else a TypeError)."""
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        raise TypeError(f"the ZeRO strategy steps a ZeroRedundancyOptimizer, not {type(optimizer).__name__}")
    return optimizer
