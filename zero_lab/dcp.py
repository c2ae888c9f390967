"""torch.distributed.checkpoint (DCP) for a ZeRO optimizer, in the format plain optimizers use.

DCP (what torchtitan and FSDP2 users save with) stores an optimizer as torch's
``get_optimizer_state_dict`` returns it: ``{"state": {fqn: {name: tensor}}, "param_groups":
[{..., "params": [fqn, ...]}]}``, every state tensor shaped like its parameter. Any world
size can then read any subset of it. For a whole-parameter partition (the default
``SortedGreedy``) torch's own ``get_optimizer_state_dict`` / ``set_optimizer_state_dict``
already work with :class:`~zero_lab.ZeroRedundancyOptimizer` (``opt.state`` and
``state_dict()`` answer on every rank), at the cost of the full state on the target rank.
The two functions here work for every partition (``Flat`` cuts parameters into element
ranges) and hold only ≈ 1/W of the state per rank:

* :func:`get_optimizer_state_dict` — each rank returns the *whole* state of every parameter
  it steps any part of (a cut parameter's pieces are all-gathered among the ranks, the only
  communication). A key several ranks hold has the same value on each; DCP writes it once.
  Before any state exists it runs one zero-gradient, ``lr=0`` step (as torch's does), so the
  dict can be DCP's load template.
* :func:`set_optimizer_state_dict` — load such a dict (from a zero_lab or a plain optimizer, at
  any world size or partition): each rank keeps its shards.

Plain optimizers are passed through to torch's functions, so one code path serves both::

    osd = zero_lab.dcp.get_optimizer_state_dict(model, opt)
    dcp.save({"model": get_model_state_dict(model), "optim": osd}, checkpoint_id=path)
    ...
    osd = zero_lab.dcp.get_optimizer_state_dict(model, opt)        # the template
    dcp.load({"optim": osd}, checkpoint_id=path)
    zero_lab.dcp.set_optimizer_state_dict(model, opt, osd)

Saving and loading through this module adds what torch's ``dcp.save`` / ``dcp.load`` lack for a
checkpoint that is shared or downloaded:

* :func:`save` — ``dcp.save``, then rank 0 writes the integrity record (every file's size and
  sha256, last; :mod:`zero_lab.dcp_record`), as the native format's manifest does;
* :func:`load` — ``dcp.load`` through :func:`~zero_lab.dcp_reader.checked_reader`: ``.metadata``
  unpickled with an allow list of DCP's metadata classes, non-tensor values read
  ``weights_only``, every file checked against the record (a checkpoint without one loads, with
  a one-line warning that it is unverified); a failure is one
  :class:`~zero_lab.checkpoint.CheckpointError` line naming the checkpoint, the file and the cause;
* :func:`check` — the same decided before loading, from the files and the metadata alone
  (:mod:`zero_lab.dcp_check`): the record, truncated or missing files, each tensor's shape and
  dtype against a template, keys the template lacks.

    zero_lab.dcp.save({"model": get_model_state_dict(model), "optim": osd}, path)
    zero_lab.dcp.load({"model": ..., "optim": osd}, path)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_check import check_files, check_fits, load_failure
from zero_lab.dcp_reader import METADATA, CheckedReading, checked_reader
from zero_lab.dcp_record import RECORD, write_record
from zero_lab.engine.state import dcp_state_dict, parameter_names
from zero_lab.engine.wrapper import engine_of
from zero_lab.optimizer import MASTER_KEY, ZeroRedundancyOptimizer
from zero_lab.shard_state import merge_states


def _torch_state_dict() -> Any:
    """``torch.distributed.checkpoint.state_dict``, imported on first use: importing it loads
    DTensor and the checkpoint planner (about 0.8 s), which a job that never writes this format
    should not pay at start."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


__all__ = ["check", "get_optimizer_state_dict", "load", "save", "set_optimizer_state_dict"]

log = logging.getLogger(__name__)


def _fqns(model: nn.Module, opt: ZeroRedundancyOptimizer) -> list[str]:
    """The DCP name of each of ``opt``'s parameters, by global index (DDP's ``module.`` and
    ``torch.compile``'s ``_orig_mod.`` stripped, as torch's functions name them)."""
    by_id: dict[int, str] = {}
    for name, param in model.named_parameters():
        fqns = _torch_state_dict()._get_fqns(model, name)  # torch's own naming, so the two formats agree
        by_id[id(param)] = next(iter(fqns))
    missing = [i for i, p in enumerate(opt.all_params) if id(p) not in by_id]
    if missing:
        raise ValueError(
            f"the optimizer's parameters #{missing[0]} (and {len(missing) - 1} more) are not parameters of the "
            "model passed to zero_lab.dcp; pass the model the optimizer was built from"
        )
    return [by_id[id(p)] for p in opt.all_params]


def _materialize(opt: ZeroRedundancyOptimizer) -> None:
    """One zero-gradient, ``lr=0`` step when no state exists yet (on every rank: it exchanges),
    so the state's names and shapes exist for a DCP load template (torch's ``_init_optim_state``)."""
    if opt.state or any(p.grad is not None for p in opt.all_params):
        return
    saved_lrs = [group["lr"] for group in opt.param_groups]
    for param in opt.all_params:
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    for group in opt.param_groups:
        group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    opt.step()
    for group, lr in zip(opt.param_groups, saved_lrs):
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)


def get_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The DCP form of ``optimizer``'s state on this rank (see the module docstring). Call on every rank.
    An optimizer :class:`~zero_lab.ShardedDataParallel` re-pointed: its state per parameter of the
    engine's module (:func:`zero_lab.engine.state.dcp_state_dict`)."""
    engine = engine_of(optimizer)
    if engine is not None:
        return dcp_state_dict(engine)
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        return _torch_state_dict().get_optimizer_state_dict(model, optimizer)
    _materialize(optimizer)
    fqns = _fqns(model, optimizer)
    mine = optimizer.local_shard_states()
    cut = set(optimizer.partition.cut_params())
    pieces: dict[int, list[tuple[tuple[int, int], dict[str, Any]]]] = {}
    if cut and optimizer.world_size > 1:
        local_cut = {i: v for i, v in mine.items() if i in cut}
        everyone: list[Any] = [None] * optimizer.world_size
        dist.all_gather_object(everyone, local_cut, group=optimizer.process_group)
        for rank_states in everyone:
            for index, (start, stop, state) in rank_states.items():
                pieces.setdefault(index, []).append(((start, stop), state))
    params = optimizer.all_params
    state: dict[str, dict[str, Any]] = {}
    for index, (start, stop, shard_state) in mine.items():
        own = pieces.get(index, [((start, stop), shard_state)])
        whole = merge_states(own, params[index].shape)
        device = params[index].device
        state[fqns[index]] = {k: v.to(device) if torch.is_tensor(v) else v for k, v in whole.items() if k != MASTER_KEY}
    groups = optimizer._packed_state([])["param_groups"]
    for group in groups:
        group["params"] = [fqns[i] for i in group["params"]]
    return {"state": state, "param_groups": groups}


def set_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Load a DCP-form optimizer state (whole tensors keyed by FQN); each rank keeps its shards."""
    engine = engine_of(optimizer)
    if engine is None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        _torch_state_dict().set_optimizer_state_dict(model, optimizer, state_dict)
        return
    fqns = parameter_names(engine) if engine is not None else _fqns(model, optimizer)  # type: ignore[arg-type]
    index_of = {fqn: i for i, fqn in enumerate(fqns)}
    unknown = [fqn for group in state_dict["param_groups"] for fqn in group["params"] if fqn not in index_of]
    if unknown:
        raise ValueError(
            f"the optimizer state names parameter {unknown[0]!r}, which this model does not have; "
            "load a checkpoint saved from the same model"
        )
    groups = [{**group, "params": [index_of[fqn] for fqn in group["params"]]} for group in state_dict["param_groups"]]
    state = {index_of[fqn]: dict(entry) for fqn, entry in state_dict["state"].items() if fqn in index_of}
    target = engine.states() if engine is not None else optimizer
    target.load_state_dict({"state": state, "param_groups": groups})


def _barrier(process_group: dist.ProcessGroup | None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=process_group)


def _is_writer(process_group: dist.ProcessGroup | None) -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank(process_group) == 0


def save(state_dict: dict[str, Any], path: str | Path, process_group: dist.ProcessGroup | None = None) -> Path:
    """``dcp.save(state_dict)`` into ``path``, then the integrity record (rank 0, after every rank
    finished). Call on every rank (or without a process group)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    dcp.save(state_dict, checkpoint_id=str(path), process_group=process_group)
    _barrier(process_group)
    if _is_writer(process_group):
        write_record(path)
    _barrier(process_group)
    return path


def load(state_dict: dict[str, Any], path: str | Path, process_group: dist.ProcessGroup | None = None) -> bool:
    """``dcp.load(state_dict)`` from ``path`` through the checked reader (module docstring), in
    place. Returns whether the files were verified against an integrity record; without one a
    WARNING says the checkpoint is loaded unverified. Raises one-line :class:`CheckpointError`."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such directory")
    reader = checked_reader(path)
    if not reader.verified:
        log.warning("checkpoint %s has no integrity record (%s): its files are loaded unverified", path, RECORD)
    _read_metadata_first(reader, path, process_group)
    try:
        dcp.load(state_dict, storage_reader=reader, process_group=process_group)
    except dcp.CheckpointException as error:  # a BaseException: every rank raises it, with every rank's cause
        raise load_failure(path, error) from None
    return reader.verified


def _read_metadata_first(reader: CheckedReading, path: Path, process_group: dist.ProcessGroup | None) -> None:
    """Read the metadata once before ``dcp.load`` does, so a missing, tampered or unreadable one is
    this rank's one-line error (the same on every rank: they read the same file), not torch's
    fallback to per-rank metadata, which logs a traceback on the root logger. A checkpoint saved
    without a coordinator has only ``__<rank>.metadata``: that one must then read."""
    try:
        reader.read_metadata()
    except CheckpointError:
        rank = dist.get_rank(process_group) if dist.is_available() and dist.is_initialized() else 0
        if not (path / f"__{rank}{METADATA}").exists() or (path / METADATA).exists():
            raise
        reader.read_metadata(rank=rank)


def check(path: str | Path, state_dict: dict[str, Any] | None = None, strict: Sequence[str] = ("model",)) -> bool:
    """Check ``path`` before loading it (:mod:`zero_lab.dcp_check`): its files (against the
    integrity record when it has one: returns whether it did), its metadata, and, given a
    ``state_dict`` template, each tensor's shape and dtype and, under the ``strict`` top-level
    keys, no key the template lacks. No process group needed; raises one-line :class:`CheckpointError`."""
    metadata, verified = check_files(path)
    if state_dict is not None:
        check_fits(path, metadata, state_dict, strict)
    return verified
