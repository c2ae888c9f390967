"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each YAML option under ``conf/<group>/`` names its schema first in its defaults list
(``- /schema/optim@_here_: adam``), so OmegaConf checks keys and types while Hydra
composes: ``optim.lr=abc`` or ``overlap=maybe`` fail before any process starts, and a
typo'd key is rejected by struct mode. Ranges and combinations that types cannot
express are checked by :func:`zero_lab.app.validate.check`.

    from zero_lab.app.schema import register_configs
    register_configs()  # before hydra.main / hydra.compose

To add a group option: add a dataclass here, store it in :func:`register_configs`, and
write ``conf/<group>/<name>.yaml`` that names it first in its defaults list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

__all__ = ["Backend", "Config", "Device", "DistConfig", "LoggerMode", "OverlapHook", "ParamDtype", "register_configs"]


class Backend(str, Enum):
    gloo = "gloo"
    nccl = "nccl"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class OverlapHook(str, Enum):
    """Which ``zero_lab.overlap`` hook steps the optimizer inside DDP's backward."""

    zero_step = "zero_step"  # hook_with_zero_step: after the last bucket is reduced
    interleaved = "interleaved"  # hook_with_zero_step_interleaved: each bucket as soon as it is reduced


class ParamDtype(str, Enum):
    """The dtype the model's parameters (and so DDP's gradients and the exchange) live in."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class LoggerMode(str, Enum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


# ----------------------------------------------------------------------------- optim
@dataclass
class ClassRef:
    """A class named by dotted path, resolved at instantiation (``optimizer_class``)."""

    _target_: str = "hydra.utils.get_class"
    path: str = "torch.optim.Adam"


@dataclass
class AdamSchema:
    """``torch.optim.Adam`` / ``AdamW``; built as a partial, params given at the call site."""

    _target_: str = "torch.optim.Adam"
    _partial_: bool = True
    _convert_: str = "all"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False
    max_grad_norm: float | None = None  # clip the global 2-norm before every step (app key, not passed on)


@dataclass
class SGDSchema:
    _target_: str = "torch.optim.SGD"
    _partial_: bool = True
    _convert_: str = "all"
    lr: float = 1e-2
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    max_grad_norm: float | None = None  # clip the global 2-norm before every step (app key, not passed on)


@dataclass
class ZeroAdamSchema(AdamSchema):
    """``zero_lab.ZeroRedundancyOptimizer`` around ``optimizer_class`` (Adam / AdamW)."""

    _target_: str = "zero_lab.ZeroRedundancyOptimizer"
    optimizer_class: ClassRef = field(default_factory=ClassRef)
    master_weights: bool = False  # fp32 shards of bf16/fp16 params and their state (param_dtype)


@dataclass
class ZeroSGDSchema(SGDSchema):
    _target_: str = "zero_lab.ZeroRedundancyOptimizer"
    optimizer_class: ClassRef = field(default_factory=lambda: ClassRef(path="torch.optim.SGD"))
    master_weights: bool = False  # fp32 shards of bf16/fp16 params and their state (param_dtype)


# ----------------------------------------------------------------------------- partitioner
@dataclass
class SortedGreedySchema:
    _target_: str = "zero_lab.partition.SortedGreedy"


@dataclass
class ManualSchema:
    """One list of parameter-name globs (or ``re:<regex>``) per rank."""

    _target_: str = "zero_lab.partition.Manual"
    _convert_: str = "all"
    params_per_rank: list[list[str]] = MISSING


@dataclass
class FlatSchema:
    _target_: str = "zero_lab.partition.Flat"


@dataclass
class DdpBucketSchema:
    """Follow DDP's gradient buckets (needs ``overlap=true``, whose hook attaches them)."""

    _target_: str = "zero_lab.partition.DdpBucket"
    shard_buckets: bool = False


# ----------------------------------------------------------------------------- model
@dataclass
class MLPSchema:
    _target_: str = "zero_lab.app.models.MLP"
    in_dim: int = 32
    hidden: int = 64
    out_dim: int = 32
    depth: int = 3
    activation: str | None = "tanh"
    bias: bool = True


@dataclass
class TinyLMSchema:
    _target_: str = "zero_lab.app.models.TinyLM"
    vocab_size: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_layer: int = 2
    n_head: int = 2
    mlp_ratio: int = 4


# ----------------------------------------------------------------------------- data
@dataclass
class RegressionDataSchema:
    """Inputs ``x ~ N(0, 1)``, targets from a fixed random teacher; dims follow the model."""

    _target_: str = "zero_lab.app.data.RegressionData"
    global_batch: int = 32
    in_dim: int = "${model.in_dim}"  # type: ignore[assignment]
    out_dim: int = "${model.out_dim}"  # type: ignore[assignment]
    noise: float = 0.01
    seed: int = "${seed}"  # type: ignore[assignment]


@dataclass
class TokenDataSchema:
    """Token sequences following a seeded affine rule mod ``vocab_size``; an LM can learn it."""

    _target_: str = "zero_lab.app.data.TokenData"
    global_batch: int = 16
    vocab_size: int = "${model.vocab_size}"  # type: ignore[assignment]
    seq_len: int = "${model.seq_len}"  # type: ignore[assignment]
    seed: int = "${seed}"  # type: ignore[assignment]


# ----------------------------------------------------------------------------- logger
@dataclass
class WandbSchema:
    """W&B run owned by rank 0; offline by default (no key, no network), files in the run dir."""

    _target_: str = "zero_lab.app.sinks.WandbSink"
    _partial_: bool = True
    project: str = "zero_lab"
    entity: str | None = None
    mode: LoggerMode = LoggerMode.offline
    name: str | None = None
    group: str | None = None
    job_type: str = "train"
    tags: list[str] = field(default_factory=list)
    notes: str | None = None


@dataclass
class NoLoggerSchema:
    _target_: str = "zero_lab.app.sinks.NullSink"
    _partial_: bool = True


# ----------------------------------------------------------------------------- top level
@dataclass
class DistConfig:
    """Where the ranks run. ``timeout_s`` bounds every collective (the run itself has no
    time limit); ``stop_grace_s`` is how long ranks may take to stop after SIGTERM/SIGINT."""

    world_size: int = 2
    backend: Backend = Backend.gloo
    device: Device = Device.cpu
    timeout_s: float = 900.0
    stop_grace_s: float = 120.0
    threads_per_rank: int = 1
    bucket_cap_mb: float = 25.0


@dataclass
class Config:
    """The root config. Groups are typed by their option's schema; plain keys here."""

    optim: Any = MISSING
    partitioner: Any = MISSING
    model: Any = MISSING
    data: Any = MISSING
    dist: DistConfig = field(default_factory=DistConfig)
    logger: Any = MISSING
    overlap: bool = False
    overlap_hook: OverlapHook = OverlapHook.zero_step
    bucket_view: bool = False
    param_dtype: ParamDtype = ParamDtype.float32
    seed: int = 0
    steps: int = 20
    log_every: int = 1
    checkpoint_every: int = 0
    resume: str | None = None
    progress: bool = True
    objective: Any = "final_loss"  # what the job returns to a sweeper: a name or a list (zero_lab/app/objective.py)


_GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "optim": {"adam": AdamSchema, "sgd": SGDSchema, "zero_adam": ZeroAdamSchema, "zero_sgd": ZeroSGDSchema},
    "partitioner": {
        "sorted_greedy": SortedGreedySchema,
        "manual": ManualSchema,
        "flat": FlatSchema,
        "ddp_bucket": DdpBucketSchema,
    },
    "model": {"mlp": MLPSchema, "transformer": TinyLMSchema},
    "data": {"regression": RegressionDataSchema, "tokens": TokenDataSchema},
    "logger": {"wandb": WandbSchema, "none": NoLoggerSchema},
}


def register_configs() -> None:
    """Store the root schema as ``config_schema`` and group schemas under ``schema/<group>``."""
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, options in _GROUP_SCHEMAS.items():
        for name, node in options.items():
            store.store(group=f"schema/{group}", name=name, node=node)
