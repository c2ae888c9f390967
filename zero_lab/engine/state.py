"""The engine's optimizer state per module parameter: what checkpoints save and load.

The optimizer :class:`~zero_lab.ShardedDataParallel` re-points steps one 1-D view per bucket this
rank owns a part of, so its own ``state_dict()`` is this rank's shard keyed by those views.
:class:`EngineStates` reads and writes the same state per *module parameter*, as element ranges
``{index: (start, stop, state)}`` over the parameters of the optimizer's original param groups
(in their order) — the form :class:`~zero_lab.ZeroRedundancyOptimizer` gives — so that:

* zero_lab's native checkpoint (:func:`zero_lab.checkpoint.save_checkpoint` /
  :func:`~zero_lab.checkpoint.load_checkpoint`) saves and loads an engine run, resharding across
  world sizes and partitioners, with ``EngineStates`` in the optimizer's place::

      checkpoint.save_checkpoint(path, engine.states(), engine.module)
      checkpoint.load_checkpoint(path, engine.states(), engine.module)

* :meth:`EngineStates.full_state_dict` gives the consolidated ``torch.optim`` state dict on one
  rank (as ``ZeroRedundancyOptimizer.consolidate_state_dict`` + ``state_dict()`` do), and
  :meth:`EngineStates.load_state_dict` loads such a dict (or a plain optimizer's) on every rank;
* :func:`dcp_state_dict` gives DCP's form (whole tensors keyed by the parameters' names,
  :func:`parameter_names`); :mod:`zero_lab.dcp` dispatches an engine's optimizer here, and loads
  that form back through :meth:`EngineStates.load_state_dict`.

Algorithm: cutting (saving) — each owned view's elementwise state (tensors of the view's
length) is cut at the parameter boundaries (:func:`~zero_lab.engine.layout.owned_pieces`), a
piece that is a whole parameter reshaped to it; other entries (``step``) go to every piece.
Gluing (loading) — each piece's state is flattened into its place in a zero tensor of the view's
length (the padding of a ``Flat`` bucket keeps zeros, as training leaves it), and the result is
loaded through the optimizer's own ``load_state_dict`` with the saved hyper-parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from zero_lab.chained import GROUP_CLASS_KEY, NOT_HYPERPARAMETERS, ChainedOptimizer, class_path
from zero_lab.comm import Communicator
from zero_lab.engine.bucket_group import BucketGroup
from zero_lab.engine.buffer import ParamAndGradBuffer
from zero_lab.engine.layout import Bucket, OwnedPiece, owned_pieces
from zero_lab.engine.main_params import write_main
from zero_lab.hierarchy import Hierarchy
from zero_lab.optimizer import MASTER_KEY
from zero_lab.partition import Partitioner
from zero_lab.shard_state import merge_states, slice_state

__all__ = ["EngineStates", "dcp_state_dict", "parameter_names"]

State = dict[str, Any]
ShardStates = dict[int, tuple[int, int, State]]


class EngineParts(Protocol):
    """What this module reads of :class:`zero_lab.ShardedDataParallel` (which imports it)."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    comm: Communicator
    partitioner: Partitioner
    buckets: tuple[Bucket, ...]
    buffer: ParamAndGradBuffer
    group_params: list[list[torch.Tensor]]
    group: BucketGroup
    hierarchy: Hierarchy

    def wait_for_params(self) -> None: ...


@dataclass(frozen=True)
class _Shard:
    """Elements ``[start, stop)`` of parameter ``param`` (an index of :attr:`EngineStates.all_params`)."""

    param: int
    start: int
    stop: int


class _Partition:
    """What the native checkpoint asks of a partition: this rank's ranges of each parameter."""

    def __init__(self, shards: list[_Shard]):
        self._shards = shards

    def shards_of(self, rank: int) -> list[_Shard]:
        return self._shards


class EngineStates:
    """The engine's optimizer state per module parameter (see the module docstring)."""

    def __init__(self, engine: EngineParts):
        self.engine = engine
        self.optim = engine.optimizer
        self.rank = engine.comm.rank
        self.world_size = engine.comm.world_size
        self.communicator = engine.comm
        #: with shard groups (``shard_size`` < W): the ranks holding the same ranges in the other groups;
        #: the native checkpoint is then written by group 0 alone (the others hold replicas)
        self.replica_communicator = engine.group.replicas
        self.hierarchy = engine.hierarchy
        self.partitioner = engine.partitioner
        self.all_params = [p for params in engine.group_params for p in params]
        index_of = {id(p): i for i, p in enumerate(self.all_params)}
        #: the buffer's parameter index -> index in :attr:`all_params`
        self._index = {b: index_of[id(p)] for b, p in enumerate(engine.buffer.params) if id(p) in index_of}
        self._pieces = owned_pieces(engine.buckets, self.rank)
        self.partition = _Partition(
            [_Shard(self._index[p.param], p.first, p.first + p.stop - p.start) for p in self._pieces]
        )
        self._stepped = self._stepped_tensors()

    def _stepped_tensors(self) -> list[tuple[torch.Tensor, int | None, list[tuple[OwnedPiece, int, int]]]]:
        """What the optimizer steps, in its own order (its local indices): each tensor, its bucket when it
        is a bucket's owned range (``None``: a whole parameter of a class that steps whole matrices), and
        its pieces with their element positions in the tensor."""
        buffer = self.engine.buffer
        bucket_of = {id(main): b for b, main in enumerate(buffer.main) if main is not None}
        whole = {id(buffer.params[p.param]): p for p in self._pieces if p.whole}
        stepped: list[tuple[torch.Tensor, int | None, list[tuple[OwnedPiece, int, int]]]] = []
        for tensor in (t for group in self.optim.param_groups for t in group["params"]):
            b = bucket_of.get(id(tensor))
            if b is not None:
                parts = [(p, p.start, p.stop) for p in self._pieces if p.bucket == b]
            else:
                parts = [(whole[id(tensor)], 0, tensor.numel())]
            stepped.append((tensor, b, parts))
        return stepped

    def _is_main_copy(self, tensor: torch.Tensor, b: int | None) -> bool:
        return b is not None and tensor is not self.engine.buffer.owned[b]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's param groups with their original parameters (the module's, not the views)."""
        return [
            {**{k: v for k, v in group.items() if k != "params"}, "params": params}
            for group, params in zip(self.optim.param_groups, self.engine.group_params)
        ]

    @property
    def join_device(self) -> torch.device:
        data = self.engine.buffer.param_data
        return data[0].device if data else torch.device("cpu")

    def group_classes(self) -> list[type[torch.optim.Optimizer]]:
        if isinstance(self.optim, ChainedOptimizer):
            return list(self.optim.group_classes())
        return [type(self.optim)] * len(self.optim.param_groups)

    def wait_for_exchange(self) -> None:
        self.engine.wait_for_params()

    # ------------------------------------------------------------------ this rank's shard
    def local_shard_states(self) -> ShardStates:
        """This rank's state as ``{index: (start, stop, state on CPU)}`` (a whole parameter's
        elementwise entries shaped like it, a range's 1-D)."""
        self.wait_for_exchange()
        out: ShardStates = {}
        for tensor, b, parts in self._stepped:
            state = self.optim.state.get(tensor)
            if not state:
                continue
            if self._is_main_copy(tensor, b):  # an fp32 main copy: saved as ZeRO saves its masters
                state = {**state, MASTER_KEY: tensor}
            for piece, lo, hi in parts:
                first = piece.first
                out[self._index[piece.param]] = (first, first + hi - lo, self._cut(state, tensor, piece, lo, hi))
        return out

    def _cut(self, state: State, tensor: torch.Tensor, piece: OwnedPiece, lo: int, hi: int) -> State:
        shape = self.engine.buffer.params[piece.param].shape
        cut: State = {}
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == tensor.numel():
                part = value.reshape(-1)[lo:hi]
                cut[key] = (part.reshape(shape) if piece.whole else part).detach().cpu().clone()
            else:
                cut[key] = value.detach().cpu().clone() if torch.is_tensor(value) else value
        return cut

    def load_shard_states(
        self, state_of: Callable[[int, int, int], State | None], groups: list[dict[str, Any]]
    ) -> None:
        """Load what this rank steps: ``state_of(index, start, stop)`` gives each piece's state (``None``:
        none saved); ``groups`` the hyper-parameters, one dict per param group."""
        self.wait_for_exchange()
        write_main(self.engine.buffer.owned, self.engine.buffer.main)  # fp32 main copies from the parameters
        local: dict[int, State] = {}
        for position, (tensor, b, parts) in enumerate(self._stepped):
            states = [state_of(self._index[p.param], p.first, p.first + hi - lo) for p, lo, hi in parts]
            if all(s is None for s in states):
                continue
            if any(s is None for s in states):
                missing = parts[[s is None for s in states].index(True)][0].param
                raise ValueError(
                    f"the state to load has no entry for parameter #{self._index[missing]} but has one for another "
                    "parameter the engine steps in the same bucket; load a state saved from a run of all of them"
                )
            local[position] = self._glue(tensor, parts, states)  # type: ignore[arg-type]
            master = local[position].pop(MASTER_KEY, None)
            if master is not None and self._is_main_copy(tensor, b):
                with torch.no_grad():
                    tensor.copy_(master)  # the saved fp32 main copy, finer than the bf16 parameter
        local_groups, offset = [], 0
        for group, live in zip(groups, self.optim.param_groups):
            hyper = {k: v for k, v in group.items() if k not in NOT_HYPERPARAMETERS}
            local_groups.append({**hyper, "params": list(range(offset, offset + len(live["params"])))})
            offset += len(live["params"])
        self.optim.load_state_dict({"state": local, "param_groups": local_groups})

    @staticmethod
    def _glue(tensor: torch.Tensor, parts: list[tuple[OwnedPiece, int, int]], states: list[State]) -> State:
        glued: State = {}
        for key, value in states[0].items():
            first_length = parts[0][2] - parts[0][1]
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == first_length:
                flat = torch.zeros(tensor.numel(), dtype=value.dtype, device=tensor.device)
                for (_, lo, hi), state in zip(parts, states):
                    flat[lo:hi] = state[key].reshape(-1)
                glued[key] = flat.view(tensor.shape)
            else:
                glued[key] = value
        return glued

    # ------------------------------------------------------------------ the whole state
    def full_state_dict(self, to: int = 0) -> dict[str, Any] | None:
        """The whole optimizer state in plain ``torch.optim`` format on rank ``to`` (indices over the
        original param groups, state shaped like each parameter), ``None`` elsewhere. Collective."""
        gathered = self.communicator.gather_objects(self.local_shard_states(), to=to, device=self.join_device)
        if gathered is None:
            return None
        pieces: dict[int, list[tuple[tuple[int, int], State]]] = {}
        for rank_states in gathered:
            for index, (start, stop, state) in rank_states.items():
                pieces.setdefault(index, []).append(((start, stop), state))
        state = {i: merge_states(pieces[i], self.all_params[i].shape) for i in sorted(pieces)}
        return {"state": state, "param_groups": self._packed_groups(list(range(len(self.all_params))))}

    def _packed_groups(self, keys: list[Any]) -> list[dict[str, Any]]:
        """The param groups without tensors, ``params`` named by ``keys`` (one per parameter, in order)."""
        classes = self.group_classes()
        several = len(set(classes)) > 1
        groups, offset = [], 0
        for group, cls in zip(self.param_groups, classes):
            packed = {k: v for k, v in group.items() if k != "params"}
            if several:
                packed[GROUP_CLASS_KEY] = class_path(cls)
            packed["params"] = keys[offset : offset + len(group["params"])]
            offset += len(group["params"])
            groups.append(packed)
        return groups

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole ``torch.optim`` state dict (:meth:`full_state_dict`'s, or a plain optimizer's over
        the same param groups) on every rank: each keeps its pieces."""
        sizes = [len(g["params"]) for g in state_dict["param_groups"]]
        if sizes != [len(p) for p in self.engine.group_params]:
            raise ValueError(
                f"state_dict has param groups of sizes {sizes} but the engine's optimizer had "
                f"{[len(p) for p in self.engine.group_params]}; load a state saved from the same parameters"
            )
        keys = [key for group in state_dict["param_groups"] for key in group["params"]]

        def state_of(index: int, start: int, stop: int) -> State | None:
            saved = state_dict["state"].get(keys[index])
            return None if saved is None else slice_state(saved, self.all_params[index].shape, start, stop)

        self.load_shard_states(state_of, state_dict["param_groups"])


def parameter_names(engine: EngineParts) -> list[str]:
    """The name in the wrapped module of each parameter of :attr:`EngineStates.all_params` (DCP's keys,
    as torch names an unwrapped model's)."""
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return [names[id(p)] for params in engine.group_params for p in params]


def dcp_state_dict(engine: EngineParts) -> dict[str, Any]:
    """The DCP form of the engine's optimizer state on this rank: the whole state of every parameter
    this rank steps a part of, keyed by its name; a parameter cut across ranks is glued from every
    rank's piece (the ranks gather the cut pieces to each rank in turn). Before any state exists,
    one zero-gradient ``lr=0`` step makes it (as torch's ``_init_optim_state``), so the dict can be
    DCP's load template. Collective."""
    _materialize(engine)
    states = EngineStates(engine)
    fqns = parameter_names(engine)
    mine = states.local_shard_states()
    numel = [p.numel() for p in states.all_params]
    cut = {i: v for i, v in mine.items() if (v[0], v[1]) != (0, numel[i])}
    pieces: dict[int, list[tuple[tuple[int, int], State]]] = {}
    for to in range(states.world_size if states.world_size > 1 else 0):
        everyone = states.communicator.gather_objects(cut, to, states.join_device)
        for rank_states in everyone or []:
            for index, (start, stop, state) in rank_states.items():
                if index in cut:
                    pieces.setdefault(index, []).append(((start, stop), state))
    state: dict[str, State] = {}
    for index, (start, stop, piece) in mine.items():
        whole = merge_states(pieces.get(index, [((start, stop), piece)]), states.all_params[index].shape)
        device = states.all_params[index].device
        state[fqns[index]] = {k: v.to(device) if torch.is_tensor(v) else v for k, v in whole.items() if k != MASTER_KEY}
    return {"state": state, "param_groups": states._packed_groups(fqns)}


def _materialize(engine: EngineParts) -> None:
    """One zero-gradient, ``lr=0`` step of the owned views when the optimizer has no state yet."""
    optim = engine.optimizer
    if optim.state:
        return
    views = [main for main in engine.buffer.main if main is not None]  # whole matrices get theirs at the step
    saved = [group["lr"] for group in optim.param_groups]
    for view in views:
        view.grad = torch.zeros_like(view)
    for group in optim.param_groups:
        group["lr"] = torch.tensor(0.0) if torch.is_tensor(group["lr"]) else 0.0
    optim.step()
    for group, lr in zip(optim.param_groups, saved):
        group["lr"] = lr
    for view in views:
        view.grad = None
    engine.wait_for_params()
