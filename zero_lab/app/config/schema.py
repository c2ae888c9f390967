"""Config schemas, registered in Hydra's ConfigStore: typed plain keys, and group schemas
derived from the constructors.

:class:`Config` types the plain keys (enums for choices), so ``overlap=maybe`` or
``param_dtype=bf16`` fail while Hydra composes; a new key is one field there (or in
:class:`DistConfig`) with its type, default and a comment. A group option's schema is derived
from its ``_target_``'s signature (:func:`option_schema`): every argument with a plain default
becomes a typed key with that default (``optim.eps=1e-6`` works on ``optim=adam`` although
adam.yaml sets only ``lr``), arguments the app passes (:data:`SUPPLIED_BY_APP`) are left out,
and a ``**kwargs`` forwarded to a class the YAML names (``optimizer_class``) takes that
class's arguments. So the constructor stays the one place of an argument, its type and default.

    register_configs()  # before hydra.main / hydra.compose
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import logging
import math
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from hydra.core.config_store import ConfigStore
from hydra.utils import get_object
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.config.paths import CONF_DIR, group_options
from zero_lab.app.workloads.protocols import OUTPUT_KEY
from zero_lab.ddp_buckets import DDP_BUCKET_CAP_MB

__all__ = [
    "APP_KEYS",
    "DATA_PARALLEL",
    "FORMATS",
    "GROUPS",
    "HYDRA_KEYS",
    "PARAM_DTYPES",
    "POLICIES",
    "SUPPLIED_BY_APP",
    "Autocast",
    "Backend",
    "Config",
    "DataParallel",
    "Device",
    "DistConfig",
    "OverlapHook",
    "ParamDtype",
    "ResumeOptimizer",
    "constructor_arguments",
    "enum_str",
    "option_schema",
    "register_configs",
]

#: Config groups whose options are built from a ``_target_``.
GROUPS = ("optim", "partitioner", "model", "data", "logger", "scheduler")

#: Constructor arguments the app passes at the call site, never from the config, per group: the
#: parameters and the ZeRO wiring (``app/run/build.py``), the sink's run dir and config (``app/record/sinks.py``).
SUPPLIED_BY_APP: dict[str, frozenset[str]] = {
    "optim": frozenset(
        {
            "params",
            "process_group",
            "partitioner",
            "parameters_as_bucket_view",
            "overlap_with_ddp",
            "exchange",
            "ddp_buckets",
            "shard_size",
        }
    ),
    "logger": frozenset({"run_dir", "config"}),
    "scheduler": frozenset({"optimizer"}),
}

#: Keys of a group that the app reads and the constructor never sees: ``{group: {key: (type, default)}}``.
APP_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    "optim": {
        "max_grad_norm": (float | None, None),  # clip the global 2-norm before every step (app/run/build.py)
        "param_groups": (Any, None),  # a _partial_ target model -> param groups (app/run/build.py: param_groups)
    },
    "scheduler": {"warmup_steps": (int, 0)},  # linear warmup before the scheduler (app/run/build.py make_scheduler)
}

#: Keys of a group node that instantiate() reads, not the constructor.
HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")


def enum_str(value: Any) -> str:
    """``Backend["gloo"]`` -> ``"gloo"``; plain strings pass through."""
    return str(getattr(value, "value", value))


def _choices(name: str, values: Iterable[str], doc: str) -> type[enum.Enum]:
    """A ``str`` enum whose members are ``values``, the constant the core or the app states
    them in; the config types a key with it, so a value outside it fails while Hydra composes."""
    made = enum.Enum(name, {value: value for value in values}, type=str, module=__name__)  # type: ignore[misc]
    made.__doc__ = doc
    return made


Backend = _choices("Backend", ("gloo", "nccl"), "``dist.backend=``: gloo (CPU) or nccl (GPU)")
Device = _choices("Device", ("cpu", "cuda"), "``dist.device=``: cpu, or cuda (one GPU per rank)")
OverlapHook = _choices("OverlapHook", ("zero_step", "interleaved"), "``overlap_hook=``: zero_lab.overlap's hook")
Autocast = _choices("Autocast", ("bf16", "fp16"), "``autocast=``: torch.autocast's dtype around forward and loss")

#: ``resume_optimizer``: what to do with the checkpoint's optimizer.
POLICIES = {
    "strict": "load its state; the optimizer class and hyper-parameters must equal this run's",
    "override": "load its state (same class), then this run's hyper-parameters replace the checkpoint's",
    "reset": "load the model weights and step only; the optimizer starts fresh from this run's config",
}
#: ``checkpoint_format``: how ``checkpoint_every`` saves.
FORMATS = {
    "native": "zero_lab's sharded directories (ZeRO) or one .pt file (plain optimizers)",
    "dcp": "torch.distributed.checkpoint directories (step_N.dcp), readable by torchtitan/FSDP2/DDP scripts",
}
ResumeOptimizer = _choices("ResumeOptimizer", POLICIES, "``resume_optimizer=``: zero_lab.app.config.schema.POLICIES")
CheckpointFormat = _choices("CheckpointFormat", FORMATS, "``checkpoint_format=``: zero_lab.app.config.schema.FORMATS")

#: ``dp=``: which data-parallel engine trains.
DATA_PARALLEL = {
    "auto": "zero_lab for a zero_* optimizer unless a key only the DDP path takes is set, else ddp "
    "(zero_lab/app/plan/data_parallel.py)",
    "ddp": "torch's DistributedDataParallel (gradients all-reduced by DDP; zero_* shards the state after it)",
    "zero_lab": "zero_lab.ShardedDataParallel: ZeRO-2 on buffers it owns (zero_lab/engine/, docs/core.md)",
}
DataParallel = _choices("DataParallel", DATA_PARALLEL, "``dp=``: zero_lab.app.config.schema.DATA_PARALLEL")

#: ``param_dtype=``: the dtype the model's parameters (and so DDP's gradients and the exchange) live in.
PARAM_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ParamDtype = _choices("ParamDtype", PARAM_DTYPES, "``param_dtype=``: zero_lab.app.config.schema.PARAM_DTYPES")


@dataclass
class DistConfig:
    """Where the ranks run (``dist.<key>``). ``world_size``, ``backend`` and ``device`` are what
    a ``dist=`` option picks (``conf/dist/cpu.yaml``, ``cuda.yaml``); the rest default here."""

    world_size: int = MISSING  # ranks (on dist=cuda: your GPU count)
    backend: Backend = MISSING  # gloo (CPU) or nccl (GPU)
    device: Device = MISSING  # cpu or cuda (one GPU per rank, cuda:LOCAL_RANK)
    timeout_s: float = 900.0  # bounds every collective (the run itself has no time limit)
    stop_grace_s: float = 120.0  # how long ranks may take to stop after SIGTERM/SIGINT
    # a rank with no progress this long past the slowest step stops the world, named (null: only timeout_s)
    stall_timeout_s: float | None = 30.0
    threads_per_rank: int = 1  # torch.set_num_threads of each rank
    # ZeRO: partition the state over groups of this many consecutive ranks, replicate across groups (null: all;
    # node: the ranks of one node, as torchrun or srun say)
    shard_size: Any = None
    # DDP's gradient bucket size (partitioner=ddp_bucket follows the buckets)
    bucket_cap_mb: float = float(DDP_BUCKET_CAP_MB)
    # more ranks than CPU cores x this is refused before any start; raise it to oversubscribe
    max_ranks_per_core: int = 2
    master_port: int | None = None  # under srun: the rendezvous port (null: derived from the job id)
    # DDP's own options (torch.nn.parallel.DistributedDataParallel), passed as they are:
    find_unused_parameters: bool = False  # a model whose forward leaves some parameters unused
    static_graph: bool = False  # the same parameters used the same way every step
    broadcast_buffers: bool = True  # rank 0's buffers (BatchNorm statistics) to every rank before each forward
    sync_batchnorm: bool = False  # BatchNorm -> torch.nn.SyncBatchNorm: statistics over the global batch (GPU only)


@dataclass
class Config:
    """The root config: the groups (typed by their option's derived schema) and every plain key with
    its type, default and what it does (``python train.py --cfg job`` prints them all)."""

    optim: Any = MISSING
    partitioner: Any = MISSING
    model: Any = MISSING
    data: Any = MISSING
    dist: DistConfig = field(default_factory=DistConfig)
    logger: Any = MISSING
    scheduler: Any = MISSING
    # auto: zero_lab for optim=zero_* unless a key only DDP takes is set (overlap, bucket_view, compile, ...), else
    # ddp; zero_lab (zero_lab.ShardedDataParallel: ZeRO-2 on its own buffers; takes prefetch, exchange, grad_reduce
    # (auto / null: its per-backend defaults) and the partitioner); ddp (torch's DDP, the optimizer after it)
    dp: DataParallel = DataParallel["auto"]
    overlap: bool = False  # step inside DDP's comm hook (needs a zero_* optimizer)
    # with overlap: zero_step (after the last bucket) or interleaved (per bucket)
    overlap_hook: OverlapHook = OverlapHook["zero_step"]
    bucket_view: bool = False  # parameters_as_bucket_view: one collective per buffer, not per tensor
    # zero_*: the parameter exchange's collective, a registered name or a class's dotted path (app/config/registered.py;
    # auto times each at step 1)
    exchange: str = "auto"
    prefetch: bool = False  # zero_*: step() only issues the exchange; the next forward waits per module
    # zero_*: reduce gradients to their owners only (null: DDP's all-reduce, untouched); all_reduce is DDP's
    # traffic through zero_lab's meter; reduce_scatter halves it; auto times each once (zero_lab.grad_reduce)
    grad_reduce: str | None = None  # a registered name or a class's dotted path (app/config/registered.py)
    # zero_* with grad_reduce: release the gradients this rank does not own AFTER backward (the peak during
    # backward stays DDP's; for ZeRO-2 at the peak use dp=zero_lab)
    release_grads: bool = False
    # the parameters' dtype; add optim.master_weights=true (zero_*) for fp32 shards
    param_dtype: ParamDtype = ParamDtype["float32"]
    accumulate: int = 1  # micro-batches per step (the global batch is split; DDP no_sync on all but the last)
    # bf16 or fp16 (with GradScaler): torch.autocast around forward and loss, fp32 parameters
    autocast: Autocast | None = None
    compile: bool = False  # torch.compile the DDP-wrapped model
    eval_every: int = 0  # N > 0: validation loss on held-out batches every N steps and at the end (val/loss)
    eval_batches: int = 2  # held-out batches per validation (data.val_shard)
    # a model whose forward returns a dict / ModelOutput: the entry data.loss reads (app/workloads/protocols.py)
    output_key: str = OUTPUT_KEY
    seed: int = 0  # model init; each step's draws come from (seed, rank, step)
    steps: int = 20  # optimizer steps
    log_every: int = 1  # write metrics every N steps (the last step is always written)
    checkpoint_every: int = 0  # 0 = never; K: every K steps, checkpoints/step_<8 digits> (a dir for zero_*, else .pt)
    keep_checkpoints: int | None = None  # after each save keep only the N newest checkpoints; null or 0 = keep all
    # native (sharded dir for zero_*, else .pt) or dcp (torch.distributed.checkpoint, step_<8 digits>.dcp/)
    checkpoint_format: CheckpointFormat = CheckpointFormat["native"]
    resume: str | None = None  # a run dir (or checkpoint file) to continue from
    # what a resume does with the optimizer (POLICIES)
    resume_optimizer: ResumeOptimizer = ResumeOptimizer["strict"]
    progress: bool = True  # tqdm bar on rank 0 (only when stderr is a terminal)
    # what the job returns to a sweeper (Optuna): a name of app.objective.OBJECTIVES, or a list of them
    objective: Any = "final_loss"


def constructor_arguments(
    target: Any, node: DictConfig | dict[str, Any], supplied: frozenset[str] = frozenset()
) -> dict[str, inspect.Parameter]:
    """The arguments a config node may set: ``target``'s, without the ``supplied`` ones; a ``**kwargs``
    takes those of the classes the node looks up (:func:`forwarded_classes`: ZeRO's ``optimizer_class``)."""
    parameters = dict(inspect.signature(target, eval_str=True).parameters)
    out = {name: p for name, p in parameters.items() if name not in supplied and p.kind not in _VARIADIC}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        for inner in forwarded_classes(node):
            for name, p in constructor_arguments(inner, {}, supplied).items():
                out.setdefault(name, p)
    return out


def forwarded_classes(node: DictConfig | dict[str, Any]) -> list[type]:
    """Classes a node names as ``{_target_: hydra.utils.get_class, path: <dotted path>}``."""
    lookups = [v for v in node.values() if isinstance(v, (dict, DictConfig)) and v.get("_target_") == _GET_CLASS]
    return [get_object(str(value["path"])) for value in lookups]


def option_schema(group: str, name: str, node: DictConfig) -> type:
    """The schema of one group option (a dataclass), derived from its ``_target_``'s signature."""
    target = get_object(str(node["_target_"]))
    fields: dict[str, tuple[Any, Any]] = {key: (Any, MISSING) for key in HYDRA_KEYS if key in node}
    for key, parameter in constructor_arguments(target, node, SUPPLIED_BY_APP.get(group, frozenset())).items():
        kind = _omegaconf_type(parameter.annotation)
        if parameter.default is inspect.Parameter.empty:
            fields[key] = (kind, MISSING)  # the YAML (or the command line) must give it
        elif _plain(parameter.default):
            fields[key] = (kind, parameter.default)
    fields.update(APP_KEYS.get(group, {}))
    for key in node:  # keys the YAML sets that no argument covers (_target_, optimizer_class, ...)
        if key != "defaults" and key not in fields:
            fields[str(key)] = (Any, MISSING)
    spec = [(key, kind, _field(default)) for key, (kind, default) in fields.items()]
    return dataclasses.make_dataclass(f"{group}_{name}_schema", spec)


#: What a group option's YAML or its ``_target_`` can raise while its schema is derived: a file or
#: YAML that cannot be read, an import that fails, a signature or string annotation that cannot be
#: read (``eval_str``), a key that is no field name.
UNSCHEMED = (
    OSError,
    yaml.YAMLError,
    OmegaConfBaseException,
    ImportError,
    ValueError,
    TypeError,
    NameError,
    AttributeError,
    SyntaxError,
)


def register_configs(conf_dir: Path = CONF_DIR, extra_dirs: Sequence[Path] = ()) -> None:
    """Store the root schema as ``config_schema`` and, as ``derived/<group>/<name>``, the schema of
    each ``<dir>/<group>/<name>.yaml`` of ``conf_dir`` and the user's ``extra_dirs`` (``--config-dir``,
    ``hydra.searchpath``; the first dir holding a name wins, as in Hydra's search path). The root
    config merges it under whatever option a group picks (``optional derived/<group>@<group>``). A
    YAML whose ``_target_`` cannot be imported gets none; the pre-start check names it."""
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group in GROUPS:
        seen: set[str] = set()
        for directory in (conf_dir, *extra_dirs):
            for name in group_options(group, directory):
                if name in seen:
                    continue
                seen.add(name)
                path = Path(directory, group, f"{name}.yaml")
                try:
                    node = OmegaConf.load(path)
                    if not isinstance(node, DictConfig) or node.get("_target_") is None:  # scheduler=none
                        continue
                    with _hydra_lookup_quiet():  # the pre-start check says it once, with its cause
                        schema = option_schema(group, name, node)
                except UNSCHEMED:  # a YAML or a _target_ that cannot be read: check/rules.py names it
                    continue
                store.store(group=f"derived/{group}", name=name, node=schema)


@contextlib.contextmanager
def _hydra_lookup_quiet() -> Iterator[None]:
    """Hydra's ``get_object`` logs "Error getting object at …" before it raises; a YAML whose
    ``_target_`` cannot be imported is reported by the pre-start check instead."""
    logger = logging.getLogger("hydra.utils")
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_GET_CLASS = "hydra.utils.get_class"
_PRIMITIVES = (bool, int, float, str)


def _omegaconf_type(annotation: Any) -> Any:
    """The annotation as a type OmegaConf checks: a primitive, an Enum, ``X | None``, else Any; tensors
    in a union are dropped (``float | Tensor`` -> float), ``int | float`` is float."""
    if _is_plain_type(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None) and _is_plain_type(a)]
        if set(members) == {int, float}:
            members = [float]
        optional = type(None) in typing.get_args(annotation)
        if len(members) == 1:
            return members[0] | None if optional else members[0]
    return Any


def _is_plain_type(annotation: Any) -> bool:
    return annotation in _PRIMITIVES or (isinstance(annotation, type) and issubclass(annotation, enum.Enum))


def _plain(value: Any) -> bool:
    """A default a config can hold: None, a primitive, an Enum, or a list/tuple of those."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (*_PRIMITIVES, enum.Enum))


def _field(default: Any) -> Any:
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: list(default))
    return field(default=default)
