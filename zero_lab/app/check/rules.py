"""Check a composed config before any process starts; report every problem at once.

The constructors are the truth, built and run without a process group and without memory. First
every ``_target_`` is looked up without being called and fitted to its key
(:func:`~zero_lab.app.config.targets.check_targets`); a refused one stops the check, so no rule
builds what was not checked. Then the job's :class:`~zero_lab.app.plan.run_plan.RunPlan` is made
once (the meta model with ``optim.param_groups`` applied, the partitioner, the data source): every
rule in :data:`_RULES` reads it, none builds again, and an object that could not be built is
reported by its own rule only. One :class:`ConfigError` lists each problem as
``key=value: what is allowed``, naming the shipped options that fit where one is the fix
(:mod:`zero_lab.app.check.options`).

    check(cfg, choices={"optim": "zero_adam", ...})   # raises ConfigError

Adding a plain key with a range: one line in :func:`_check_ranges` (``bounds``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from zero_lab.app.check.host import available_memory_bytes, cpu_cores
from zero_lab.app.check.options import data_for_task, either, fitting_partitioners, on_device, zero_options
from zero_lab.app.check.resume import resume_problems
from zero_lab.app.check.scheduler import scheduler_problems
from zero_lab.app.config.problems import exclusive_key_problems, unresolved_problems
from zero_lab.app.config.registered import EXCHANGE, name_or_value, registry_problems
from zero_lab.app.config.schema import (
    APP_KEYS,
    GROUPS,
    HYDRA_KEYS,
    SUPPLIED_BY_APP,
    Config,
    DistConfig,
    constructor_arguments,
    enum_str,
    forwarded_classes,
)
from zero_lab.app.config.targets import check_targets, refusal
from zero_lab.app.plan.data_parallel import engine_refuses
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.run_plan import RunPlan, shard_size_of
from zero_lab.app.record.objective import check_objective
from zero_lab.app.workloads.protocols import embedding_rows, forward_problems, protocol_problems, task_of
from zero_lab.app.workloads.user_code import attempt
from zero_lab.chained import GROUP_CLASS_KEY, NOT_HYPERPARAMETERS, group_class
from zero_lab.optimizer import OVERLAP_EXCHANGES, check_partition_fits

__all__ = ["ConfigError", "check", "to_container"]


class ConfigError(ValueError):
    """A config that cannot run; ``problems`` holds one line per problem, ``job`` names the
    sweep job they belong to (its overrides), if any."""

    def __init__(self, problems: list[str], job: str | None = None):
        self.problems = problems
        self.job = job
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        where = f" in the job `{job}`" if job else ""
        super().__init__(f"invalid config ({count}){where}:\n" + "\n".join(f"  - {p}" for p in problems))


def check(cfg: DictConfig, choices: Mapping[str, Any]) -> RunPlan:
    """Raise :class:`ConfigError` listing every problem in ``cfg`` (``choices``: Hydra's group choices,
    to name options as the command line does); return the job's RunPlan (which every rule read) if none."""
    problems = check_targets(cfg)  # before anything is built: a _target_ that does not fit its key is never called
    if problems:
        raise ConfigError(problems)
    plan = RunPlan.of(cfg)  # one meta model, one partitioner, one data source: for every rule
    if plan.optim_problem:
        problems.append(plan.optim_problem)
    unresolved: list[InterpolationResolutionError] = []
    for rule in _RULES:
        try:
            problems.extend(rule(cfg, choices, plan))
        except InterpolationResolutionError as error:  # every rule that resolves meets it: one line per key
            unresolved.append(error)
    problems += unresolved_problems(unresolved, problems, choices)
    if problems:
        raise ConfigError(problems)
    return plan


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python (enums as strings), safe to pickle to ranks."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


# ----------------------------------------------------------------------------- rules
def _choice(choices: Mapping[str, Any], group: str, cfg: DictConfig) -> str:
    return str(choices.get(group) or cfg[group].get("_target_", "?"))


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, f"{prefix}{index}.")
    else:
        yield prefix.rstrip("."), node


def _check_known_keys(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """Top-level and ``dist.`` keys are :class:`~zero_lab.app.config.schema.Config`'s fields: one added
    with ``+`` (``+warmup_steps=10``) would be accepted and ignored, so it is refused as a typo is."""
    out = []
    for prefix, node, schema in (("", cfg, Config), ("dist.", cfg.get("dist"), DistConfig)):
        if not isinstance(node, DictConfig):
            continue
        allowed = [f.name for f in dataclasses.fields(schema)]
        for key in (str(k) for k in node if k not in allowed):
            close = difflib.get_close_matches(key, allowed, n=1)
            guess = f"did you mean {prefix}{close[0]}? " if close else ""
            where = prefix.rstrip(".") or "the top level"
            out.append(f"{prefix}{key}: no such key; {guess}{where} takes: {', '.join(allowed)}")
    return out


_INT64 = (-(2**63), 2**63 - 1)
_WIDER = {"seed": (0, 2**64 - 1)}  # torch.manual_seed takes any unsigned 64-bit seed


def _check_numbers(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """No nan / inf anywhere (``optim.lr=inf`` would train to a nan loss and exit 0), and every integer
    fits 64 bits (torch, JSON readers and W&B take no wider ones): ``seed=18446744073709551616`` is
    refused here, not by a rank's ``manual_seed``."""
    out = []
    for key, value in _leaves(to_container(cfg)):
        if isinstance(value, float) and not math.isfinite(value):
            out.append(f"{key}={value}: must be a finite number")
        elif isinstance(value, int) and not isinstance(value, bool):
            low, high = _WIDER.get(key.rsplit(".", 1)[-1], _INT64)  # data.seed: ${seed}
            if not low <= value <= high:
                out.append(f"{key}={value}: must fit in 64 bits ({low} … {high})")
    return out


def _check_ranges(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    out = []
    warmup = cfg.scheduler.get("warmup_steps", 0) if cfg.get("scheduler") is not None else 0
    bounds: list[tuple[str, Any, float, str]] = [
        ("dist.world_size", cfg.dist.world_size, 1, "a positive number of ranks"),
        ("dist.threads_per_rank", cfg.dist.threads_per_rank, 1, "at least 1 thread"),
        ("dist.max_ranks_per_core", cfg.dist.max_ranks_per_core, 1, "at least 1 rank per core"),
        ("steps", cfg.steps, 1, "at least 1 step"),
        ("log_every", cfg.log_every, 1, "at least 1 (log every N steps)"),
        ("checkpoint_every", cfg.checkpoint_every, 0, "0 (never) or K > 0 (every K steps)"),
        ("seed", cfg.seed, 0, "a non-negative int"),
        ("accumulate", cfg.accumulate, 1, "micro-batches per optimizer step"),
        ("eval_every", cfg.eval_every, 0, "0 (never) or K > 0 (every K steps)"),
        ("eval_batches", cfg.eval_batches, 1, "held-out batches per evaluation"),
        ("scheduler.warmup_steps", warmup, 0, "steps of linear warmup"),
    ]
    for key, value, low, allowed in bounds:
        if value < low:
            out.append(f"{key}={value}: must be >= {low} ({allowed})")
    for key in ("timeout_s", "stop_grace_s", "bucket_cap_mb"):
        if cfg.dist[key] <= 0:
            out.append(f"dist.{key}={cfg.dist[key]}: must be > 0")
    stall = cfg.dist.get("stall_timeout_s")
    if stall is not None and stall <= 0:
        out.append(f"dist.stall_timeout_s={stall}: must be > 0 (seconds past the slowest step), or null to turn it off")
    return out


def _check_devices(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """The backend, ``dist.sync_batchnorm`` (torch's SyncBatchNorm has no CPU kernel) and the ranks per
    device or core. DDP's other options train to DDP + the plain optimizer's parameters with every ZeRO
    mode (tests/dist/test_ddp_options.py): nothing to refuse."""
    device, backend = enum_str(cfg.dist.device), enum_str(cfg.dist.backend)
    world = cfg.dist.world_size
    out = []
    if backend == "nccl" and device != "cuda":
        out.append("dist.backend=nccl: needs dist.device=cuda; on CPU use dist.backend=gloo")
    if cfg.dist.get("sync_batchnorm") and device != "cuda":
        out.append(
            "dist.sync_batchnorm=true: torch's SyncBatchNorm runs on GPUs only; use "
            f"{either('dist', on_device('cuda'))}, or keep "
            "dist.sync_batchnorm=false (each rank normalises its own slice; dist.broadcast_buffers=true, the "
            "default, gives every rank rank 0's running statistics)"
        )
    if device == "cuda":
        if not torch.cuda.is_available():
            out.append(
                f"dist.device=cuda: no CUDA device is visible here; use {either('dist', on_device('cpu'))} "
                "(dist.device=cpu)"
            )
        elif "LOCAL_RANK" not in os.environ and world > torch.cuda.device_count():
            out.append(
                f"dist.world_size={world}: only {torch.cuda.device_count()} CUDA devices here (one rank per device)"
            )
    elif "LOCAL_RANK" not in os.environ:  # under torchrun the ranks are torchrun's, maybe on many nodes
        cores = cpu_cores()
        per_core = cfg.dist.max_ranks_per_core
        if per_core >= 1 and world > cores * per_core:
            out.append(
                f"dist.world_size={world}: {world} ranks on {cores} CPU cores is more than "
                f"dist.max_ranks_per_core={per_core} per core ({cores * per_core} ranks); lower dist.world_size, "
                f"or run oversubscribed with dist.max_ranks_per_core={math.ceil(world / cores)}"
            )
    return out


def _check_engine(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """``dp=zero_lab``: each switch the engine does not take yet
    (:func:`~zero_lab.app.plan.data_parallel.engine_refuses`: it overlaps its own reductions with backward, its
    parameters are views of its buckets already, it releases unowned gradients per bucket itself; ``compile``),
    and ``autocast=fp16`` (GradScaler unscales the gradients before the engine's step pre-hook reduces them).
    ``dp=auto`` takes the DDP path for each of them, so only an explicit ``dp=zero_lab`` meets these."""
    if plan.dp.dp != "zero_lab":
        return []
    out = []
    for setting in engine_refuses(cfg):
        key = setting.split("=")[0]
        if key == "autocast":
            out.append("autocast=fp16: dp=zero_lab does not take it yet (GradScaler); use autocast=bf16 or dp=ddp")
        else:
            out.append(f"{setting}: dp=zero_lab does not take it yet; set {key}=false or use dp=ddp")
    return out


def _check_shard_size(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """``dist.shard_size``: divides ``dist.world_size``, and only where the state is sharded: by the
    engine (``dp=zero_lab``), or by a ZeRO optimizer on the DDP path (:mod:`zero_lab.hierarchy`)."""
    if cfg.dist.get("shard_size") is None or cfg.dist.world_size < 1:
        return []
    try:
        size = shard_size_of(cfg)
    except ValueError as error:
        return [str(error)]
    if size == cfg.dist.world_size:
        return []
    if plan.dp.dp == "zero_lab":
        return []  # the engine shards whatever class steps (optim=adam as optim=zero_adam)
    if plan.optim is not None and not plan.optim.strategy.shards_state:
        return [f"dist.shard_size={size}: optim={_choice(choices, 'optim', cfg)} keeps no sharded state; use "
                f"{either('optim', zero_options())}, or drop dist.shard_size"]  # fmt: skip
    return []


def _check_loop_features(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """``accumulate`` against the batch, ``autocast``, ``eval_every``, ``optim.max_grad_norm`` (positive, and
    every gradient must exist before the step); ranges: :func:`_check_ranges`."""
    out = []
    accumulate, world, batch = cfg.accumulate, cfg.dist.world_size, cfg.data.get("global_batch")
    rows = batch // world if isinstance(batch, int) and world >= 1 and batch % world == 0 else None
    if rows is not None and accumulate >= 1 and rows % accumulate:
        out.append(
            f"accumulate={accumulate}: each rank's {rows} rows per step (data.global_batch={batch} over "
            f"dist.world_size={world}) do not split into {accumulate} equal micro-batches; make data.global_batch "
            f"a multiple of {world * accumulate}"
        )
    autocast = enum_str(cfg.autocast) if cfg.autocast is not None else None
    if autocast and enum_str(cfg.param_dtype) != "float32":
        out.append(
            f"autocast={autocast} with param_dtype={enum_str(cfg.param_dtype)}: autocast computes in {autocast} from "
            "fp32 parameters; with low-precision parameters drop autocast (or set param_dtype=float32)"
        )
    if autocast == "fp16" and cfg.overlap:
        out.append(
            "autocast=fp16 with overlap=true: the GradScaler must unscale and skip the step, which overlap runs "
            "inside backward; use autocast=bf16 (no scaler), or overlap=false"
        )
    if cfg.eval_every > 0 and not callable(getattr(get_object(cfg.data._target_), "val_shard", None)):
        out.append(
            f"eval_every={cfg.eval_every}: data={_choice(choices, 'data', cfg)} has no held-out batches; add "
            "val_shard(index, rank, world_size) to it (zero_lab/app/workloads/protocols.py), or eval_every=0"
        )
    max_norm = cfg.optim.get("max_grad_norm")
    if max_norm is not None and max_norm <= 0:
        out.append(f"optim.max_grad_norm={max_norm}: must be > 0, or null to not clip")
    elif max_norm is not None and cfg.overlap:
        out.append(
            "optim.max_grad_norm: clipping needs the global norm of every gradient before the step, but "
            "overlap=true steps each bucket inside backward; use overlap=false or optim.max_grad_norm=null"
        )
    return out


def _check_grad_reduce(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """``grad_reduce`` reduces each gradient to the rank that steps it (:mod:`zero_lab.grad_reduce`), so
    on the DDP path it needs a ZeRO optimizer (the engine shards any), except ``all_reduce`` (DDP's
    traffic, metered: the baseline for the bytes per phase). ``release_grads`` releases unowned
    gradients after backward: a ZeRO optimizer and a ``grad_reduce`` hook. ``autocast=fp16`` is
    refused with a hook: the GradScaler would look for infs in this rank's owned gradients only, and
    ranks that disagree on skipping a step would issue different exchanges."""
    name = enum_str(cfg.grad_reduce) if cfg.get("grad_reduce") is not None else None
    release = bool(cfg.get("release_grads", False))
    # the engine (dp=zero_lab) shards whatever class steps: grad_reduce is its mode with optim=adam too
    engine = plan.dp.dp == "zero_lab"
    steps_every_parameter = not engine and plan.strategy is not None and not plan.strategy.shards_state
    optim = choices.get("optim") or "this optimizer"
    out = []
    if name is not None and name != "all_reduce" and steps_every_parameter:
        out.append(
            f"grad_reduce={name}: optim={optim} steps every parameter, so it needs every gradient; use a ZeRO "
            f"optimizer ({either('optim', zero_options())}), or grad_reduce=all_reduce (DDP's traffic, metered) or null"
        )
    if release and name is None:
        out.append(
            "release_grads=true with grad_reduce=null: DDP's own all-reduce keeps every gradient; add "
            "grad_reduce=reduce_scatter (or auto, or all_reduce: DDP's traffic, owned gradients kept only)"
        )
    elif release and steps_every_parameter:
        out.append(
            f"release_grads=true: optim={optim} steps every parameter, so it needs every gradient; use a ZeRO "
            "optimizer, or release_grads=false"
        )
    autocast = enum_str(cfg.autocast) if cfg.get("autocast") is not None else None
    if name is not None and name != "all_reduce" and autocast == "fp16":
        out.append(
            f"autocast=fp16 with grad_reduce={name}: the GradScaler's inf check would see only this rank's owned "
            "gradients, and ranks skipping different steps would hang the exchange; use autocast=bf16, or "
            "grad_reduce=all_reduce"
        )
    return out


def _check_model_data(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """The model/data protocol (:mod:`zero_lab.app.workloads.protocols`): ``task`` on both, a way to read
    batches, ``data.global_batch``. Then the data source built (its constructor's checks: ``data=text``
    with a missing or empty corpus), and a vocabulary it declares (``vocab_size``) fitting the model's
    input embedding (:func:`~zero_lab.app.workloads.protocols.embedding_rows`): ids past it fail in every
    rank's lookup."""
    model_name, data_name = f"model={_choice(choices, 'model', cfg)}", f"data={_choice(choices, 'data', cfg)}"
    model_cls, data_cls = get_object(cfg.model._target_), get_object(cfg.data._target_)
    task = task_of(model_cls)  # a transformers class's from its task tables
    fitting = []
    if getattr(data_cls, "task", None) != task:  # the shipped data options for this model's task
        fitting = [f"data={name}" for name in data_for_task(task)]
    out = protocol_problems(model_cls, data_cls, model_name, data_name, fitting)
    batch = cfg.data.get("global_batch")
    world = cfg.dist.world_size
    if not isinstance(batch, int):
        out.append(f"data.global_batch: required (rows per step over all ranks); add global_batch: <int> ({data_name})")
    elif batch < 1 or (world >= 1 and batch % world):
        out.append(f"data.global_batch={batch}: must be a positive multiple of dist.world_size={world}")
    if isinstance(plan.data.error, OmegaConfBaseException):  # an interpolation that does not resolve: the
        return out  # composition's to name
    if (error := plan.data.error) is not None:
        return [*out, f"{data_name}: cannot be built: {refusal('data', cfg.data, error)}"]
    vocab = getattr(plan.data.value, "vocab_size", None)
    rows = embedding_rows(plan.model.value) if isinstance(vocab, int) and plan.model.value is not None else None
    if rows is None or vocab <= rows:  # no model: reported by _check_model
        return out
    own = "vocab_size" in cfg.model
    model_key = f"model.vocab_size={rows}" if own else model_name
    data_key = f"data.vocab_size={vocab}" if "vocab_size" in cfg.data else f"{data_name} (vocabulary {vocab})"
    fix = f"set model.vocab_size={vocab}" if own else "give the model an embedding of that many rows"
    return [
        *out,
        f"{model_key} with {data_key}: the data's token ids go up to {vocab - 1}, but the model's embedding has "
        f"{rows} rows; {fix}",
    ]


def _check_arguments(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """Bind every group node to its ``_target_``'s signature: unknown and missing keys named."""
    out = []
    for group in GROUPS:
        node = cfg[group]
        if node.get("_target_") is None and group == "scheduler":  # scheduler=none
            continue
        target_name = str(node.get("_target_"))
        try:
            target = get_object(target_name)
        except (ImportError, ValueError) as error:
            out.append(f"{group}._target_={target_name}: cannot be imported ({error})")
            continue
        given = SUPPLIED_BY_APP.get(group, frozenset())
        arguments = constructor_arguments(target, node, given)
        keys = [str(k) for k in node if k not in HYDRA_KEYS and k not in APP_KEYS.get(group, {})]
        variadic = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(target).parameters.values())
        takes_any = variadic and not forwarded_classes(node)
        supplied = [key for key in keys if key in given]
        unknown = [key for key in keys if key not in arguments and key not in given and not takes_any]
        if supplied:
            names = ", ".join(f"{group}.{key}" for key in supplied)
            out.append(f"{names}: given by the app at the call site, not by the config; remove it")
        if unknown:
            names = ", ".join(f"{group}.{key}" for key in unknown)
            wraps = "".join(f" around {c.__name__}" for c in forwarded_classes(node))
            own = (
                f"; to train a class of your own, give it its own YAML (--config-dir DIR with DIR/{group}/<name>.yaml "
                f"naming its _target_, then {group}=<name>): its keys are then that class's arguments"
                if group in ("model", "data")
                else ""
            )
            out.append(
                f"{names}: not {'an argument' if len(unknown) == 1 else 'arguments'} of {target_name}{wraps}; "
                f"it takes: {', '.join(arguments)}{own}"
            )
        for key, parameter in arguments.items():
            if parameter.default is inspect.Parameter.empty and key not in node:
                out.append(f"{group}.{key}: required by {target_name}; add {group}.{key}=<value>")
    return out


def _optimizer_kwargs(cfg: DictConfig, optim: OptimPlan) -> dict[str, Any]:
    """The arguments the optimizer class receives (ZeRO forwards its ``**defaults``)."""
    own = inspect.signature(optim.target).parameters if GROUP_CLASS_KEY in cfg.optim else {}
    optim = to_container(cfg)["optim"]
    return {k: v for k, v in optim.items() if k not in HYDRA_KEYS and k not in APP_KEYS["optim"] and k not in own}


def _check_optim(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """Build the real optimizer class with the configured arguments (torch's own checks)."""
    if plan.optim is None:  # reported by check() or _check_arguments
        return []
    sharded, cls = plan.optim.strategy.shards_state, plan.optim.optimizer_class
    optim = _choice(choices, "optim", cfg)
    out = []
    for key in ("prefetch", "overlap"):
        if cfg.get(key) and not sharded:
            out.append(f"{key}=true: needs a ZeRO optimizer ({either('optim', zero_options())}); got optim={optim}")
    kwargs = _optimizer_kwargs(cfg, plan.optim)
    finite = all(math.isfinite(v) for _, v in _leaves(kwargs) if isinstance(v, float))  # else _check_numbers'
    if finite and _binds(cls, kwargs):  # unknown keys are _check_arguments'
        out += _check_on_real_shapes(plan, optim, cls, kwargs)
    if cfg.overlap and cfg.bucket_view:
        out.append("bucket_view=true: not used with overlap=true (the exchange follows DDP's buckets); drop one")
    if cfg.overlap and (exchange := name_or_value(EXCHANGE, cfg.exchange)) not in OVERLAP_EXCHANGES:
        out.append(
            f"exchange={exchange}: with overlap=true the exchange is per DDP bucket by broadcast; "
            f"use {' or '.join(f'exchange={e}' for e in reversed(OVERLAP_EXCHANGES))}"
        )
    return out


def _check_on_real_shapes(plan: RunPlan, optim: str, cls: type, kwargs: dict[str, Any]) -> list[str]:
    """Build each param group's optimizer class on ``meta`` tensors of the model's real shapes
    (``optim.param_groups`` applied, so Muon sees the matrices it will step): a class that
    checks shapes or arguments refuses for the real reason. Without a buildable model (that is
    _check_model's to report) the class is built on one 1-element tensor."""
    model = plan.model.value
    if plan.groups.error is not None:
        return [f"optim.param_groups: cannot be applied to the model: {plan.groups.error}"]
    groups = plan.groups.value
    if model is None:
        groups = [{"params": [torch.zeros(1, device="meta", requires_grad=True)]}]
    elif groups is None:
        groups = [{"params": list(model.parameters())}]
    for index, group in enumerate(groups):
        own = group_class(group, cls)
        named = [p if isinstance(p, tuple) else (None, p) for p in group["params"]]
        params = [torch.empty(p.shape, dtype=p.dtype, device="meta", requires_grad=True) for _, p in named]
        hyper = {k: v for k, v in group.items() if k not in NOT_HYPERPARAMETERS}
        accepted = inspect.signature(own).parameters  # a group's own values get the constructor's checks too
        arguments = (kwargs if own is cls else {}) | {k: v for k, v in hyper.items() if k in accepted}
        try:
            own(params, **arguments)
        except (TypeError, ValueError, RuntimeError) as error:
            if own is cls:
                mentioned = [f"optim.{k}={v}" for k, v in kwargs.items() if _mentions(str(error), v)]
                where = f" ({', '.join(mentioned)})" if mentioned else ""
                return [f"optim={optim}: {cls.__name__} refuses these arguments{where}: {error}"]
            first = named[0][0] if named and named[0][0] else "?"
            return [
                f"optim={optim}: param group {index} ({len(params)} parameter(s), first {first!r}) is refused by "
                f"{own.__name__}: {error}; route only what it can step (optim.param_groups, e.g. "
                "zero_lab.muon_param_groups with to_adamw=[<name globs>])"
            ]
    return []


def _binds(cls: type, kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(cls).bind_partial(**kwargs)
    except TypeError:
        return False
    return True


def _mentions(message: str, value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and str(v) in message for v in values)


def _check_model(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """The model builds (on ``meta``, once, in the plan), and rank 0's first batch runs through it to
    the loss (:func:`~zero_lab.app.workloads.protocols.forward_problems`)."""
    model_name = f"model={_choice(choices, 'model', cfg)}"
    if (error := plan.model.error) is not None:
        return [f"{model_name}: cannot be built: {refusal('model', cfg.model, error)}"]
    if plan.model.value is None or plan.data.value is None or _check_model_data(cfg, choices, plan):
        return []  # reported by their own rules
    unused_ok = bool(cfg.dist.get("find_unused_parameters") or cfg.dist.get("static_graph"))  # DDP takes them then
    problems = forward_problems(plan.probe, unused_ok) if plan.probe is not None else []  # the plan's one probe
    return [f"{model_name} with data={_choice(choices, 'data', cfg)}: {p}" for p in problems]


def _check_memory_fits(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """CPU ranks started here: refuse a model whose planned memory (parameters, gradients,
    DDP buffers, optimizer state, masters; activations not counted) exceeds what this host
    has available, with the numbers, instead of a rank dying of it while building."""
    available = available_memory_bytes()
    if enum_str(cfg.dist.device) != "cpu" or available is None or "LOCAL_RANK" in os.environ or plan.optim is None:
        return []  # GPU memory and torchrun's hosts are not priced here
    sharded = plan.optim.strategy.shards_state
    if plan.specs is None or (sharded and plan.partitioner.value is None) or cfg.dist.world_size < 1:
        return []  # an unbuildable model or partitioner is reported by its own check
    # each param group priced by the class that steps it, stepped once on meta tensors (the class's own code)
    priced = attempt(lambda: plan.memory(plan.partitioner.value))
    if (memory := priced.value) is None:  # a partition or a class the planner cannot price: their checks name it
        return []
    needed = sum(rank.total_bytes for rank in memory.ranks)
    if needed <= available:
        return []
    worst = max(memory.ranks, key=lambda r: r.total_bytes)
    gib = 2**30
    return [
        f"model={_choice(choices, 'model', cfg)}: the planner prices {cfg.dist.world_size} rank(s) at "
        f"{needed / gib:.1f} GiB before activations (the fullest rank: parameters {worst.param_bytes / gib:.1f}, "
        f"gradients {worst.grad_bytes / gib:.1f}, DDP buffers {worst.ddp_buffer_bytes / gib:.1f}, optimizer state "
        f"{worst.state_bytes / gib:.1f} GiB), but this host has {available / gib:.1f} GiB available; "
        "use a smaller model or fewer ranks"
    ]


def _check_partition(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """Run the real partitioner on the model's real parameter specs at ``dist.world_size``."""
    world = cfg.dist.world_size
    if plan.optim is None or not plan.optim.strategy.shards_state or world < 1 or plan.specs is None:
        return []  # no model: reported by _check_model
    name = f"partitioner={_choice(choices, 'partitioner', cfg)}"
    if conflicting := exclusive_key_problems(cfg.partitioner, name):
        return conflicting
    if (error := plan.partitioner.error) is not None:
        return [f"{name}: cannot be built: {refusal('partitioner', cfg.partitioner, error)}"]
    partitioner = plan.partitioner.value
    assert partitioner is not None
    specs, classes, cls = plan.specs, plan.classes, plan.optim.optimizer_class
    try:
        partition = plan.partition()
    except ValueError as error:
        names = ", ".join(s.name or "?" for s in specs[:6])
        return [
            f"{name} at dist.world_size={world}: {error}{_list_syntax(cfg.partitioner, world)} "
            f"(parameter names look like: {names}, ...)"
        ]
    try:
        check_partition_fits(partition, cls, partitioner, classes)
    except ValueError as error:
        fitting = fitting_partitioners(specs, world, cls, classes)
        return [f"{name}: {error} In the config: {either('partitioner', fitting)}"]
    return []


def _list_syntax(node: DictConfig, world: int) -> str:
    """For a list-of-lists key with the wrong length: how to write one on the command line."""
    for key, value in node.items():
        if OmegaConf.is_list(value) and len(value) and all(OmegaConf.is_list(v) for v in value) and len(value) != world:
            example = ",".join(f"[pattern{r}.*]" for r in range(min(world, 3))) + (",..." if world > 3 else "")
            return f"; on the command line: 'partitioner.{key}=[{example}]' ({world} lists)"
    return ""


def _check_records(cfg: DictConfig, choices: Mapping[str, Any], plan: RunPlan) -> list[str]:
    """What the run records: ``objective`` (:func:`~zero_lab.app.record.objective.check_objective`), and
    with ``logger.mode=online`` a W&B login to record to."""
    out = check_objective(cfg.objective)
    if enum_str(cfg.logger.get("mode")) != "online":
        return out
    netrc = Path.home() / ".netrc"
    if not (os.environ.get("WANDB_API_KEY") or (netrc.exists() and "api.wandb.ai" in netrc.read_text())):
        out.append(
            "logger.mode=online: not logged in to W&B (run `wandb login` or set WANDB_API_KEY); "
            "or keep logger.mode=offline and `wandb sync` later"
        )
    return out


_RULES: list[Callable[[DictConfig, Mapping[str, Any], RunPlan], list[str]]] = [
    _check_known_keys,
    _check_numbers,
    _check_ranges,
    _check_devices,
    _check_model_data,
    _check_engine,
    _check_shard_size,
    _check_loop_features,
    scheduler_problems,
    registry_problems,
    _check_arguments,
    _check_optim,
    _check_grad_reduce,
    _check_model,
    _check_partition,
    _check_memory_fits,
    resume_problems,
    _check_records,
]
