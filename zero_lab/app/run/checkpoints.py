"""Checkpoints in the run dir, and finding them again for ``resume=``.

Three layouts under ``<run dir>/checkpoints/``, named by the next step to run:

* ``step_NNNNNNNN/`` — ZeRO and the engine: the core's sharded format (:mod:`zero_lab.checkpoint`):
  every rank writes its own shard, rank 0 the model and a manifest with every file's size and
  sha256 and the app's record in ``extra``; a directory becomes visible only when complete.
* ``step_NNNNNNNN.pt`` — plain optimizers: one atomic ``torch.save`` by rank 0 of the model, the
  whole optimizer state and the same record, its size and sha256 in ``step_NNNNNNNN.pt.sha256.json``.
* ``step_NNNNNNNN.dcp/`` — either kind with ``checkpoint_format=dcp``: torch's Distributed Checkpoint
  of ``{"model": ..., "optim": ...}`` (the optimizer in torch's format, whole tensors keyed by FQN:
  :func:`zero_lab.dcp.get_optimizer_state_dict`), which torchtitan, FSDP2 or a plain DDP script read
  with torch's own functions; rank 0 adds the record (``zero_lab.json``) and, last, every file's
  size and sha256 (:mod:`zero_lab.dcp_record`). Ranks write a hidden ``.step_N.dcp.partial-<token>``
  that rank 0 renames into place after a barrier; it is read through :func:`zero_lab.dcp.load`
  (restricted unpickling, every file checked), after the job's check (:mod:`zero_lab.app.check.callback`).

A resume finds the newest of the three (:func:`zero_lab.app.record.checkpoint_finder.find_any`).
The record (:func:`_record`): step, stepping class, losses, world size, the scheduler's and fp16
scaler's state. Any layout loads into either kind of optimizer at any world size (the sharded format
reshards by element ranges, merged for a plain optimizer; a plain state loads into
``ZeroRedundancyOptimizer.load_state_dict``), every file through the core's checked loaders. The
loop reseeds from ``(seed, rank, step)``: the step is all the RNG a resume needs.

What a resume checks (:func:`restore`): the step inside the checkpoint equals the one in its
name (a renamed ``step_N`` would skip or repeat steps) and is below ``steps``; the optimizer
class and hyper-parameters equal the checkpoint's unless ``resume_optimizer`` says otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zero_lab import checkpoint as sharded
from zero_lab import dcp as zero_dcp
from zero_lab.app.record.checkpoint_finder import DCP_EXTRA, all_checkpoints, find_any, is_dcp, step_of_any
from zero_lab.app.run.training import Training
from zero_lab.chained import GROUP_CLASS_KEY, canonical_class_path, class_path, resolve_class
from zero_lab.checkpoint import CheckpointError, load_file
from zero_lab.dcp_record import write_record

# torch.distributed.checkpoint itself is imported where a DCP checkpoint is written or read: the
# config check (schema, validate) finds checkpoints through this module and should not pay for it.

__all__ = ["Restored", "ResumeMismatch", "read_dcp_extra", "restore", "save"]

FORMAT = 1


class ResumeMismatch(CheckpointError):
    """The run resumes a checkpoint whose optimizer differs from the configured one."""


def save(
    training: Training,
    run_dir: str | Path,
    next_step: int,
    losses: list[float],
    keep: int | None = None,
    checkpoint_format: str = "native",
) -> Path:
    """Write the checkpoint of ``next_step``, then keep only the ``keep`` newest of any format (``None``/0:
    all). Call on every rank (collective for ZeRO); rank 0 prunes, after the new one is complete."""
    if checkpoint_format == "dcp":
        path = Path(run_dir) / "checkpoints" / f"step_{next_step:08d}.dcp"
        path.parent.mkdir(parents=True, exist_ok=True)
        groups = json.loads(json.dumps(sharded.hyperparameters(training.optimizer.param_groups)))
        extra = {**_record(training, next_step, losses), "zero": training.strategy.shards_state, "param_groups": groups}
        _save_dcp(training, path, extra)
    else:
        path = training.strategy.checkpoint_path(run_dir, next_step)
        whole = {"format": FORMAT, **_record(training, next_step, losses), "rng": torch.get_rng_state()}
        training.strategy.save_checkpoint(path, training.model, training.optimizer, whole)  # ZeRO: a manifest's extras
    if torch.distributed.get_rank() == 0 and keep:
        _prune(path, keep)
    return path


def _record(training: Training, next_step: int, losses: list[float]) -> dict[str, Any]:
    """What every format records besides the tensors (plain numbers: JSON in a manifest)."""
    state = {
        "step": next_step,
        GROUP_CLASS_KEY: optimizer_class(training),
        "losses": list(losses),
        "world_size": torch.distributed.get_world_size(),
    }
    if training.scheduler is not None:
        state["scheduler"] = json.loads(json.dumps(training.scheduler.state_dict()))
    if training.scaler is not None:
        state["scaler"] = training.scaler.state_dict()
    return state


def optimizer_class(training: Training) -> str:
    """The ``torch.optim`` class doing the steps (ZeRO's local ``optim``), as a dotted path."""
    return class_path(type(training.strategy.local_optimizer(training.optimizer)))


class Restored:
    """What :func:`restore` loaded: where, the step to run next, the losses so far, and the
    hyper-parameters ``resume_optimizer=override`` replaced (``{"group0.lr": [saved, now]}``)."""

    def __init__(self, path: Path, step: int, losses: list[float], overridden: dict[str, list[Any]]):
        self.path, self.step, self.losses, self.overridden = path, step, losses, overridden


def restore(training: Training, path: str | Path, steps: int, policy: str = "strict") -> Restored:
    """Load the checkpoint ``path`` names into this rank (see the module docstring for the checks)."""
    found = find_any(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint found at {path}")
    keep_state = policy != "reset"
    if is_dcp(found):
        saved = read_dcp_extra(found)
        groups = saved["param_groups"]
        load = partial(_load_dcp, training, found, load_optimizer=keep_state)
    elif found.is_dir():
        manifest = sharded.read_manifest(found)
        saved, groups = {**manifest["extra"], GROUP_CLASS_KEY: manifest.get(GROUP_CLASS_KEY)}, manifest["param_groups"]
        load = partial(_load_sharded, training, found, manifest, load_optimizer=keep_state)
    else:
        saved = sharded.load_checked_file(found)
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise CheckpointError(f"{found} is not a zero_lab app checkpoint (format {FORMAT})")
        groups = saved["optimizer"]["param_groups"]
        load = partial(_load_plain, training, found, saved, load_optimizer=keep_state)
    step = saved["step"]
    _check_step(found, step, steps)
    mine = _hyperparameters(training.optimizer.param_groups)
    if keep_state:
        _check_optimizer(found, saved.get(GROUP_CLASS_KEY), groups, optimizer_class(training), mine, policy, training)
    load()
    if keep_state and training.scheduler is not None and "scheduler" in saved:  # absent: they start fresh
        training.scheduler.load_state_dict(saved["scheduler"])
    if keep_state and training.scaler is not None and "scaler" in saved:
        training.scaler.load_state_dict(saved["scaler"])
    overridden = _override(training, mine) if policy == "override" else {}
    return Restored(found, step, list(saved["losses"])[:step], overridden)


def _describe_class(path: str | None, groups: list[dict[str, Any]]) -> str | None:
    """The class a checkpoint's state belongs to, in words a user picks an optim by. A chain
    (``zero_lab.chained.ChainedOptimizer``, the local optimizer of ``optim=zero_muon``) is
    named by the classes its groups name: ``torch.optim.muon.Muon + the default class (a
    zero_lab.chained.ChainedOptimizer)``; any other class by its path."""
    if path is None or not path.endswith(".ChainedOptimizer"):
        return path
    named = []
    for group in groups:
        value = group.get(GROUP_CLASS_KEY)
        if value is None:
            continue
        try:
            named.append(class_path(resolve_class(value)))
        except (TypeError, ValueError):
            named.append(str(value))
    unique = list(dict.fromkeys(named))
    return f"{' + '.join(unique)} + the default class (a {path})" if unique else path


def _load_plain_state(training: Training, found: Path, state_dict: dict[str, Any]) -> None:
    """Load a whole ``torch.optim`` state (a ``step_N.pt``, or a sharded checkpoint merged for a plain
    optimizer) once it fits this run's parameters and classes (:func:`zero_lab.checkpoint.check_state_dict`)."""
    groups = training.strategy.group_params(training.optimizer)
    names = {id(p): n for n, p in training.model.named_parameters()}
    sharded.check_state_dict(found, state_dict, groups, training.strategy.group_classes(training.optimizer), names)
    training.strategy.load_whole_state(training.optimizer, state_dict)


def _check_step(found: Path, step: int, steps: int) -> None:
    named = step_of_any(found)
    if named is not None and named != step:
        raise CheckpointError(
            f"{found}: its name says step {named} but it holds step {step}; rename it back to "
            f"step_{step:08d}{found.suffix} (a renamed checkpoint would skip or repeat steps)"
        )
    if step >= steps:
        raise CheckpointError(f"{found} is at step {step}; steps={steps} leaves nothing to run (raise steps)")


def _hyperparameters(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group's hyper-parameters as JSON would give them back (tuples as lists). Under an LR
    scheduler (``initial_lr`` set) ``lr`` is the schedule's, not a setting: ``initial_lr`` is compared."""
    out = json.loads(json.dumps(sharded.hyperparameters(groups)))
    for group in out:
        if "initial_lr" in group:
            group.pop("lr", None)
    return out


def _differences(saved: list[dict[str, Any]], mine: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``{"group0.lr": [saved, mine]}`` for every key whose value differs ("missing": absent)."""
    out = {}
    for index, (old, new) in enumerate(zip(_hyperparameters(saved), mine)):
        for key in sorted(set(old) | set(new)):
            if key == GROUP_CLASS_KEY and not (key in old and key in new):
                continue  # a chain's state dict names its groups' classes, its live groups do not (load checks them)
            if old.get(key, "missing") != new.get(key, "missing"):
                out[f"group{index}.{key}"] = [old.get(key, "missing"), new.get(key, "missing")]
    return out


def _check_optimizer(
    found: Path, saved_class: str | None, saved: list[dict[str, Any]], mine_class: str, mine: list[dict[str, Any]],
    policy: str, training: Training,
) -> None:  # fmt: skip
    saved_class = canonical_class_path(saved_class)  # a file written as torch.optim.adam.Adam reads the same
    if saved_class is not None and saved_class != mine_class:
        theirs = _describe_class(saved_class, saved)
        ours = _describe_class(mine_class, training.optimizer.param_groups)
        raise ResumeMismatch(
            f"{found} holds the state of {theirs}; this run builds {ours}. "
            f"Pick the optim it was saved with, or resume_optimizer=reset to keep its weights and start this "
            f"optimizer fresh"
        )
    changed = _differences(saved, mine)
    if changed and policy == "strict":
        listed = ", ".join(f"{key}: {old!r} in the checkpoint, {new!r} here" for key, (old, new) in changed.items())
        raise ResumeMismatch(
            f"{found} was saved with other optimizer hyper-parameters ({listed}). Set them back, or "
            f"resume_optimizer=override (keep its state, use this run's values) or resume_optimizer=reset "
            f"(fresh optimizer state)"
        )


def _override(training: Training, mine: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Put this run's hyper-parameters back after loading the checkpoint's; returns what changed."""
    groups = training.optimizer.param_groups
    changed = _differences(groups, mine)
    for group, values in zip(groups, mine):
        for key, value in values.items():
            group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
    return changed


def _load_plain(training: Training, found: Path, state: dict[str, Any], load_optimizer: bool) -> None:
    training.model.load_state_dict(state["model"])
    if load_optimizer:
        _load_plain_state(training, found, state["optimizer"])


def _load_sharded(training: Training, directory: Path, manifest: dict[str, Any], load_optimizer: bool) -> None:
    if load_optimizer and training.strategy.load_sharded(directory, training.model, training.optimizer):
        return
    training.model.load_state_dict(sharded.load_verified(directory, "model.pt", manifest))
    if load_optimizer:  # a plain optimizer takes the whole state, merged from the (verified) shards
        with tempfile.TemporaryDirectory() as tmp:
            plain = load_file(sharded.export_plain_state_dict(directory, Path(tmp) / "optim.pt"))
            _load_plain_state(training, directory, plain)


# ---------------------------------------------------------------------------- checkpoint_format=dcp
def _dcp_state(training: Training) -> dict[str, Any]:
    """What DCP saves, and the template it loads into (every rank; collective for ZeRO)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {
        "model": get_model_state_dict(training.model),
        "optim": zero_dcp.get_optimizer_state_dict(training.model, training.optimizer),
    }


def _save_dcp(training: Training, path: Path, extra: dict[str, Any]) -> None:
    """Write ``path`` (``.../step_N.dcp``) on every rank; rank 0 adds ``extra`` as JSON and renames it in place."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    token = [uuid.uuid4().hex[:8] if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    partial = path.with_name(f".{path.name}.partial-{token[0]}")
    dcp.save(_dcp_state(training), checkpoint_id=str(partial))  # collective: plans, writes, then metadata
    dist.barrier()
    if rank == 0:
        (partial / DCP_EXTRA).write_text(json.dumps(extra))
        write_record(partial)  # last: the size and sha256 of every file above
        if path.exists():
            shutil.rmtree(path)
        os.replace(partial, path)
    dist.barrier()


def read_dcp_extra(path: Path) -> dict[str, Any]:
    """The app's record of a DCP checkpoint (``zero_lab.json``)."""
    try:
        return json.loads((path / DCP_EXTRA).read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path / DCP_EXTRA}: cannot read the checkpoint's record ({error})") from error


def _load_dcp(training: Training, path: Path, load_optimizer: bool) -> None:
    """Load the model (and the optimizer) from ``path`` into this rank; call on every rank."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    state = _dcp_state(training)
    if not load_optimizer:
        state.pop("optim")
    zero_dcp.load(state, path)
    set_model_state_dict(training.model, state["model"])
    if load_optimizer:
        zero_dcp.set_optimizer_state_dict(training.model, training.optimizer, state["optim"])


def _prune(saved: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest complete checkpoints beside ``saved``, the one just written,
    of every format (a run dir resumed in another ``checkpoint_format`` holds both; each format's
    own pruning alone left the other's forever), ``saved`` first among those of its step; each as
    :func:`zero_lab.checkpoint.remove_checkpoint` deletes it (hidden at once, then removed)."""
    found = sorted(all_checkpoints(saved.parent), key=lambda p: (step_of_any(p) or 0, p == saved))
    for path in found[:-keep] if keep > 0 else []:
        sharded.remove_checkpoint(path)
