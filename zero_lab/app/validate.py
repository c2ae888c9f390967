"""Check a composed config before any process starts; report every problem at once.

Types and key names are already enforced by the schemas (:mod:`zero_lab.app.schema`)
while Hydra composes. This module checks what types cannot say — ranges, combinations
(``overlap=true`` with a plain optimizer, a ``manual`` partition naming unknown
parameters, a model with the wrong data) — and raises one :class:`ConfigError` whose
message lists each problem as ``key=value: what is allowed``.

    check(cfg, choices={"optim": "zero_adam", ...})   # raises ConfigError
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from zero_lab.app.objective import check_objective
from zero_lab.optimizer import ELEMENTWISE_OPTIMIZERS, ZeroRedundancyOptimizer
from zero_lab.partition import Manual, ParamSpec

__all__ = ["ConfigError", "check", "is_zero", "overlap_available"]

ZERO_TARGET = "zero_lab.ZeroRedundancyOptimizer"


class ConfigError(ValueError):
    """A config that cannot run; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        super().__init__(f"invalid config ({count}):\n" + "\n".join(f"  - {p}" for p in problems))


def is_zero(optim_cfg: Any) -> bool:
    """True when the optim node builds a ``ZeroRedundancyOptimizer`` (zero_* options)."""
    target = str(optim_cfg.get("_target_", ""))
    if target == ZERO_TARGET:
        return True
    try:
        cls = get_class(target)
    except Exception:  # an unknown target is reported elsewhere
        return False
    return isinstance(cls, type) and issubclass(cls, ZeroRedundancyOptimizer)


def overlap_available() -> bool:
    """Overlap needs ``zero_lab.overlap`` (DDP comm hooks), which lands separately."""
    return importlib.util.find_spec("zero_lab.overlap") is not None


def check(cfg: DictConfig, choices: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem in ``cfg``; return if none."""
    choices = dict(choices or {})
    problems: list[str] = []
    for rule in _RULES:
        try:
            problems.extend(rule(cfg, choices))
        except Exception as error:  # a broken node is itself a problem to report
            problems.append(f"{rule.__name__.removeprefix('_check_')}: {error}")
    if problems:
        raise ConfigError(problems)


def enum_str(value: Any) -> str:
    """``Backend.gloo`` -> ``"gloo"``; plain strings pass through."""
    return str(getattr(value, "value", value))


def _choice(choices: Mapping[str, Any], group: str, cfg: DictConfig) -> str:
    return str(choices.get(group) or cfg[group].get("_target_", "?"))


def _check_ranges(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    out = []
    bounds: list[tuple[str, Any, float, str]] = [
        ("dist.world_size", cfg.dist.world_size, 1, "a positive number of ranks"),
        ("dist.threads_per_rank", cfg.dist.threads_per_rank, 1, "at least 1 thread"),
        ("steps", cfg.steps, 1, "at least 1 step"),
        ("log_every", cfg.log_every, 1, "at least 1 (log every N steps)"),
        ("checkpoint_every", cfg.checkpoint_every, 0, "0 (never) or K > 0 (every K steps)"),
        ("seed", cfg.seed, 0, "a non-negative int"),
    ]
    for key, value, low, allowed in bounds:
        if value < low:
            out.append(f"{key}={value}: must be >= {low} ({allowed})")
    for key, value in (
        ("dist.timeout_s", cfg.dist.timeout_s),
        ("dist.stop_grace_s", cfg.dist.stop_grace_s),
        ("dist.bucket_cap_mb", cfg.dist.bucket_cap_mb),
    ):
        if value <= 0:
            out.append(f"{key}={value}: must be > 0")
    if cfg.optim.get("lr", 0) < 0:
        out.append(f"optim.lr={cfg.optim.lr}: must be >= 0")
    return out


def _check_devices(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    device, backend = enum_str(cfg.dist.device), enum_str(cfg.dist.backend)
    out = []
    if backend == "nccl" and device != "cuda":
        out.append("dist.backend=nccl: needs dist.device=cuda; on CPU use dist.backend=gloo")
    if device == "cuda":
        if not torch.cuda.is_available():
            out.append("dist.device=cuda: no CUDA device is visible here; use dist=cpu (dist.device=cpu)")
        elif "LOCAL_RANK" not in os.environ and cfg.dist.world_size > torch.cuda.device_count():
            out.append(
                f"dist.world_size={cfg.dist.world_size}: only {torch.cuda.device_count()} CUDA devices here "
                "(one rank per device)"
            )
    return out


def _check_model_data(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    model_task = getattr(get_class(cfg.model._target_), "task", None)
    data_task = getattr(get_class(cfg.data._target_), "task", None)
    if model_task != data_task:
        return [
            f"data={_choice(choices, 'data', cfg)}: model={_choice(choices, 'model', cfg)} is a {model_task!r} "
            f"model and needs data for that task (model=mlp: data=regression, model=transformer: data=tokens)"
        ]
    batch = cfg.data.global_batch
    world = cfg.dist.world_size
    if batch < 1 or (world >= 1 and batch % world):
        return [f"data.global_batch={batch}: must be a positive multiple of dist.world_size={world}"]
    return []


def _check_optim(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    zero = is_zero(cfg.optim)
    optim = _choice(choices, "optim", cfg)
    out = []
    cls = get_class(cfg.optim.optimizer_class.path if zero else cfg.optim._target_)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        out.append(f"optim: {cls!r} is not a torch.optim.Optimizer subclass")
        return out
    if cfg.overlap and not zero:
        out.append(f"overlap=true: needs a ZeRO optimizer (optim=zero_adam, zero_adamw or zero_sgd); got optim={optim}")
    elif cfg.overlap and not overlap_available():
        out.append(
            "overlap=true: DDP overlap hooks (zero_lab.overlap) are not in this version of zero_lab yet; "
            "use overlap=false"
        )
    partitioner = get_class(cfg.partitioner._target_)
    if zero and partitioner.__name__ == "DdpBucket" and not cfg.overlap:
        out.append(
            "partitioner=ddp_bucket: follows DDP's gradient buckets, which only the overlap hooks attach; "
            "add overlap=true, or pick sorted_greedy, manual or flat"
        )
    if cfg.overlap and cfg.bucket_view:
        out.append("bucket_view=true: not used with overlap=true (the exchange follows DDP's buckets); drop one")
    if zero and partitioner.__name__ == "Flat" and not issubclass(cls, ELEMENTWISE_OPTIMIZERS):
        out.append(
            f"partitioner=flat: cuts parameters into ranges, which needs an elementwise optimizer; "
            f"{cls.__name__} is not one of {[c.__name__ for c in ELEMENTWISE_OPTIMIZERS]}; use a whole-parameter "
            "partitioner (partitioner=sorted_greedy or manual)"
        )
    return out


def _check_clipping(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    """``optim.max_grad_norm``: positive, and every gradient must exist before the step."""
    out = []
    max_norm = cfg.optim.get("max_grad_norm")
    if max_norm is not None and max_norm <= 0:
        out.append(f"optim.max_grad_norm={max_norm}: must be > 0, or null to not clip")
    elif max_norm is not None and cfg.overlap:
        out.append(
            "optim.max_grad_norm: clipping needs the global norm of every gradient before the step, but "
            "overlap=true steps each bucket inside backward; use overlap=false or optim.max_grad_norm=null"
        )
    return out


def _meta_model(cfg: DictConfig) -> torch.nn.Module:
    """The model built on the meta device: its parameter names and sizes, no memory."""
    with torch.device("meta"):
        return instantiate(cfg.model)


def _check_model(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    try:
        _meta_model(cfg)
    except Exception as error:  # any constructor error is the user's to fix
        return [f"model={_choice(choices, 'model', cfg)}: cannot be built: {error}"]
    return []


def _check_partitioner(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    """Run the partitioner on the model's parameter specs (model built on the meta device)."""
    if not is_zero(cfg.optim) or cfg.dist.world_size < 1:
        return []
    try:
        model = _meta_model(cfg)
    except Exception:  # reported by _check_model
        return []
    partitioner = instantiate(cfg.partitioner)
    if isinstance(partitioner, Manual) and len(partitioner.params_per_rank) != cfg.dist.world_size:
        return [
            f"partitioner.params_per_rank: has {len(partitioner.params_per_rank)} entries but "
            f"dist.world_size={cfg.dist.world_size}; give one list of name patterns per rank"
        ]
    specs = [ParamSpec(numel=p.numel(), name=name) for name, p in model.named_parameters()]
    try:
        partitioner(specs, cfg.dist.world_size)
    except ValueError as error:
        names = ", ".join(name for name, _ in list(model.named_parameters())[:6])
        return [
            f"partitioner={_choice(choices, 'partitioner', cfg)}: {error} (parameter names look like: {names}, ...)"
        ]
    return []


def _check_resume(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    if cfg.resume is None:
        return []
    from zero_lab.app.checkpoint import checkpoint_step, find_checkpoint

    path = Path(str(cfg.resume)).expanduser()
    if not path.exists():
        return [f"resume={cfg.resume}: no such file or directory; give a run dir, or one of its checkpoints/step_*"]
    found = find_checkpoint(path)
    if found is None:
        return [f"resume={cfg.resume}: holds no complete checkpoint; run with checkpoint_every=K to write some"]
    step = checkpoint_step(found)
    if step is not None and step >= cfg.steps:
        return [
            f"resume={cfg.resume}: its checkpoint {found.name} is at step {step}; steps={cfg.steps} leaves nothing to "
            f"run (raise steps)"
        ]
    return []


def _check_logger(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    if enum_str(cfg.logger.get("mode")) != "online":
        return []
    netrc = Path.home() / ".netrc"
    logged_in = os.environ.get("WANDB_API_KEY") or (netrc.exists() and "api.wandb.ai" in netrc.read_text())
    if not logged_in:
        return [
            "logger.mode=online: not logged in to W&B (run `wandb login` or set WANDB_API_KEY); "
            "or keep logger.mode=offline and `wandb sync` later"
        ]
    return []


def _check_objective(cfg: DictConfig, choices: Mapping[str, Any]) -> list[str]:
    return check_objective(cfg.objective)


_RULES: list[Callable[[DictConfig, Mapping[str, Any]], list[str]]] = [
    _check_ranges,
    _check_devices,
    _check_model_data,
    _check_optim,
    _check_clipping,
    _check_model,
    _check_partitioner,
    _check_resume,
    _check_logger,
    _check_objective,
]


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python (enums as strings), safe to pickle to ranks."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]
