"""Which data-parallel path trains a job: ``dp=auto`` resolved by one rule, with the reason.

``dp=ddp`` (torch's DDP; a ``zero_*`` optimizer steps its shard after DDP's all-reduce) and
``dp=zero_lab`` (zero_lab's engine, :class:`zero_lab.ShardedDataParallel`) are taken as given.
``dp=auto``, the default, resolves in this order:

1. a plain optimizer (``optim=adam``): ``ddp``, DDP + the optimizer, every rank holds the whole state;
2. a ``zero_*`` optimizer with a setting only the DDP path takes (:func:`ddp_only_settings`:
   ``overlap``, ``bucket_view``, the DDP path's gradient release, ``compile``, ``autocast=fp16``,
   low-precision ``param_dtype``, DDP's own ``dist.`` options, the ZeRO wrapper's own ``optim.``
   keys): ``ddp``, so that such a key keeps its meaning (and the closing lines name the key that chose);
3. any other ``zero_*`` run: ``zero_lab``, the engine — the parameters of DDP + the same optimizer
   (bitwise at W ≤ 2; at W ≥ 3 up to rounding, not bitwise: no reduction order of the engine's is DDP's
   ring order, and the reason says which of the two a job gets, :func:`parity_with_ddp`), a lower
   peak (ZeRO-2 on its own buffers) and a faster step (docs/benchmarks.md); no mode is chosen by a
   trial that would add to the peak.

    choice = resolve_dp(cfg, OptimPlan.of(cfg.optim))
    choice.dp, choice.reason   # "zero_lab", "dp=auto: a sharded Adam and no key only DDP takes; bitwise ..."
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zero_lab.app.config.schema import APP_KEYS, HYDRA_KEYS, DistConfig, enum_str
from zero_lab.app.plan.optim_plan import OptimPlan
from zero_lab.app.plan.strategy import ENGINE
from zero_lab.chained import GROUP_CLASS_KEY

__all__ = [
    "AUTO",
    "DpChoice",
    "ddp_only_settings",
    "engine_options",
    "engine_refuses",
    "parity_with_ddp",
    "resolve_dp",
]

#: ``dp=auto``: resolved per job by :func:`resolve_dp`.
AUTO = "auto"
#: DDP's own ``dist.`` switches: the engine finds parameters no gradient reaches by itself (and steps
#: them with a zero gradient, which DDP skips), so a run that asks DDP for them trains on DDP.
DDP_SWITCHES = ("find_unused_parameters", "static_graph")


@dataclass(frozen=True)
class DpChoice:
    """The path that trains (``dp``: ``ddp`` or ``zero_lab``), what was asked (``requested``:
    ``auto``, ``ddp`` or ``zero_lab``) and why, in one line (summary.json and the closing lines)."""

    dp: str
    requested: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def resolve_dp(cfg: DictConfig, optim: OptimPlan | None) -> DpChoice:
    """The path ``cfg`` trains on (module docstring); ``optim``: its optimizer's plan (``None``: it cannot
    be looked up, DDP is assumed and the config check reports the optimizer)."""
    requested = enum_str(cfg.get("dp", AUTO))
    if requested != AUTO:
        return DpChoice(requested, requested, f"dp={requested}, as set")
    if optim is None or not optim.strategy.shards_state:
        name = optim.name if optim is not None else "optimizer"
        return DpChoice("ddp", AUTO, f"dp=auto: a plain {name}, its whole state on every rank")
    settings = ddp_only_settings(cfg, optim)
    if settings:
        return DpChoice("ddp", AUTO, f"dp=auto: {' '.join(settings)} only the DDP path takes")
    parity = parity_with_ddp(OmegaConf.select(cfg, "dist.world_size", default=None), optim.name)
    return DpChoice("zero_lab", AUTO, f"dp=auto: a sharded {optim.name} and no key only DDP takes; {parity}")


def parity_with_ddp(world_size: int | None, name: str) -> str:
    """How close the engine's parameters are to DDP + ``name``'s at ``world_size`` ranks: bitwise up to two
    (a sum of two is the same in any order); from three up to rounding, not bitwise, where the engine's
    reductions (reduce-scatter to owners, replicas after shard groups) add in another order than DDP's
    ring all-reduce (tested: parameters within 1e-6 at W=3, tests/dist/test_engine.py; losses within
    1e-5 at W=4 in shard groups of 2, tests/e2e/test_hierarchy_app.py)."""
    if world_size is None:
        return f"DDP + {name}'s parameters bitwise at W <= 2, up to rounding from W=3"
    if int(world_size) <= 2:
        return f"bitwise DDP + {name}'s parameters at W={world_size}"
    return f"DDP + {name}'s parameters up to rounding at W={world_size}, not bitwise (another summation order)"


def ddp_only_settings(cfg: DictConfig, optim: OptimPlan) -> list[str]:
    """Each setting of ``cfg`` that only the DDP path takes, as ``key=value``: the engine's refusals
    (its strategy's ``unused_keys``: it overlaps its own reductions, its parameters are views of its
    buckets, it releases unowned gradients per bucket; ``compile``; ``autocast=fp16``, whose GradScaler
    unscales before the engine reduces), ``param_dtype`` other than float32 (the engine steps fp32 main
    copies of low-precision parameters, DDP + the optimizer steps them as they are: not the same
    numbers), ``overlap_hook`` (overlap's), DDP's own ``dist.`` options
    (:data:`DDP_SWITCHES`, a ``dist.bucket_cap_mb`` of one's own: the engine has its own cap) and the
    ZeRO wrapper's own ``optim.`` keys set away from their defaults (:func:`engine_options`)."""
    out = engine_refuses(cfg)
    if cfg.get("param_dtype") is not None and enum_str(cfg.param_dtype) != "float32":
        out.append(f"param_dtype={enum_str(cfg.param_dtype)}")  # the engine steps fp32 main copies, DDP + Adam bf16
    if cfg.get("overlap_hook") is not None and enum_str(cfg.overlap_hook) != "zero_step":
        out.append(f"overlap_hook={enum_str(cfg.overlap_hook)}")
    dist = cfg.get("dist") or {}
    out += [f"dist.{key}=true" for key in DDP_SWITCHES if dist.get(key)]
    cap = dist.get("bucket_cap_mb", DistConfig.bucket_cap_mb)
    if cap != DistConfig.bucket_cap_mb:
        out.append(f"dist.bucket_cap_mb={cap}")
    _, foreign = engine_options(cfg.optim, optim)
    return out + [f"optim.{key}={_as_typed(cfg.optim[key])}" for key in foreign]


def engine_refuses(cfg: DictConfig) -> list[str]:
    """The settings ``dp=zero_lab`` refuses (``dp=auto`` takes DDP for them), as ``key=value``: its
    strategy's ``unused_keys`` and ``compile`` set true, and ``autocast=fp16``."""
    out = [f"{key}=true" for key in (*ENGINE.unused_keys, "compile") if cfg.get(key)]
    if cfg.get("autocast") is not None and enum_str(cfg.autocast) == "fp16":
        out.append("autocast=fp16")
    return out


def engine_options(optim_cfg: Mapping[str, Any], optim: OptimPlan) -> tuple[dict[str, Any], list[str]]:
    """``optim``'s keys as the engine passes them to the class that steps the state, and the keys that
    class does not take (sorted): the ZeRO wrapper's own keys count only where set away from their
    defaults (``optim=zero_adam`` and ``optim=adam`` both build Adam under the engine)."""
    skipped = (*HYDRA_KEYS, GROUP_CLASS_KEY, *APP_KEYS["optim"])
    options = {str(k): v for k, v in optim_cfg.items() if k not in skipped}
    wrapper = inspect.signature(optim.target).parameters if optim.target is not optim.optimizer_class else {}
    options = {k: v for k, v in options.items() if not (k in wrapper and v == wrapper[k].default)}
    accepted = inspect.signature(optim.optimizer_class).parameters
    return options, sorted(k for k in options if k not in accepted)


def _as_typed(value: Any) -> str:
    """``value`` as a command line sets it (``true``, not Python's ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
