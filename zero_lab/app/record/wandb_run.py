"""What a W&B run shows: a config a researcher can filter, a summary a sweep can compare.

Pure functions of dicts (no wandb import), used by :class:`zero_lab.app.record.sinks.WandbSink`:
the run's config (:func:`run_config`), its group, name and tags (:func:`identity`) and its
summary (:func:`run_summary`).

    config = run_config(resolved, meta["choices"], identity(logger_cfg, meta, world_size=2, zero=True))
"""

from __future__ import annotations

from typing import Any

from zero_lab.app.config.overrides import read
from zero_lab.app.config.schema import HYDRA_KEYS
from zero_lab.app.plan.strategy import Strategy
from zero_lab.app.record.catalogue import DDP_STATE_BYTES, EXCHANGE_MODE, IMBALANCE, STATE_VS_DDP, SUMMARY_LISTS
from zero_lab.app.record.summary import RunSummary

__all__ = ["identity", "run_config", "run_summary"]

_GETTERS = frozenset({"hydra.utils.get_class", "hydra.utils.get_method", "hydra.utils.get_object"})
MAX_TAG = 64  # W&B refuses longer tags
#: Summary scalars W&B also shows under their namespaced key (memory/imbalance, ...).
_NAMESPACED_TOO = (IMBALANCE, STATE_VS_DDP, DDP_STATE_BYTES, EXCHANGE_MODE)


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, dict):
        if node.get("_target_") in _GETTERS and "path" in node:
            out[prefix] = node["path"]  # optimizer_class: torch.optim.Adam
            return
        for key, value in node.items():
            if key not in HYDRA_KEYS:
                _flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif prefix:
        out[prefix] = node


def run_config(config: dict[str, Any], choices: dict[str, Any], logger: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as flat dotted keys (``optim.lr``) without Hydra's machinery
    (``_target_``, ...; a ``hydra.utils.get_class`` node becomes its dotted path), the option of
    every config group as a plain key (``optim: zero_adam``), and ``logger``, the logger's
    settings as the run used them (group and name filled in, unset ones left out)."""
    out: dict[str, Any] = {}
    _flatten({k: v for k, v in config.items() if k != "logger"}, "", out)
    _flatten({"logger": {k: v for k, v in logger.items() if v is not None}}, "", out)
    out.update({str(group): choice for group, choice in choices.items() if choice is not None})
    return out


def identity(logger: dict[str, Any], meta: dict[str, Any], world_size: int, zero: bool) -> dict[str, Any]:
    """``logger`` with ``group``/``name`` from the sweep unless set, and tags added: each only
    when the logger's node has that key (the schema derives the node from the sink's constructor,
    so a sink is never handed an argument it does not take): the strategy's group options, the
    world size and the job's overrides."""
    out = dict(logger)
    for key in ("group", "name"):
        if key in out:
            out[key] = out[key] or meta.get(key)
    if "tags" in out:
        choices = meta.get("choices") or {}
        groups = Strategy.of(zero).identity_groups
        own = out["tags"] or []  # null unless the user set logger.tags
        tags = [*own, *(f"{g}:{choices[g]}" for g in groups if choices.get(g)), f"world_size:{world_size}"]
        tags += [f"{o.key}:{o.value or ''}"[:MAX_TAG] for o in read(meta.get("overrides", [])) if o.root != "hydra"]
        out["tags"] = list(dict.fromkeys(tags))  # in order, once each
    return out


def run_summary(summary: RunSummary) -> dict[str, Any]:
    """W&B summary keys of ``summary.json``: scalars as they are, every per-rank list as
    ``…/rank{r}``, ``…/max``, ``…/min`` (the step keys' prefixes), and the namespaced scalars."""
    values = summary.as_dict()
    out = {k: v for k, v in values.items() if isinstance(v, (bool, int, float, str))}
    for metric in SUMMARY_LISTS:
        per_rank = values.get(metric.name) or []
        out.update({metric.at(f"rank{r}"): v for r, v in enumerate(per_rank)})
        if per_rank:
            out[metric.at("max")], out[metric.at("min")] = max(per_rank), min(per_rank)
    out.update({m.key: values[m.name] for m in _NAMESPACED_TOO if values.get(m.name) is not None})
    for phase, per_rank in (values.get("bytes_per_step") or {}).items():  # comm/bytes_per_step/grad_reduce/rank0
        out.update({f"comm/bytes_per_step/{phase}/rank{r}": v for r, v in enumerate(per_rank or [])})
    for phase, links in (values.get("bytes_per_link") or {}).items():  # comm/bytes_per_link/<phase>/<link>/rank0
        for link, per_rank in (links or {}).items():
            out.update({f"comm/bytes_per_link/{phase}/{link}/rank{r}": v for r, v in enumerate(per_rank)})
    for phase, seconds in (values.get("phase_time_s") or {}).items():
        if seconds is not None:
            out[f"time/phase_s/{phase}"] = seconds
    if values.get("grad_reduce"):
        out["comm/grad_reduce"] = values["grad_reduce"]["strategy"]
    return out
