"""Each job's config checked once, as Hydra composed it, before Hydra creates anything: a callback.

:class:`CheckConfig`, the first of ``hydra.callbacks`` in ``conf/config.yaml``, checks the one job
(:func:`check_run`; under torchrun or ``srun`` the runner's world first, then every rank takes rank
0's run dir: :mod:`zero_lab.app.check.before_start`) or every job of a sweep (:func:`check_sweep`:
expanded by the sweeper's own ``split_arguments``, composed as its launcher will; a sweep the
sweeper draws itself, Optuna's ``interval(...)``, with its fixed overrides, each trial as it
starts). The task checks only a config no callback of this process checked
(:func:`check_unless_checked`). Whatever fails ends the job before anything exists: one
``zero_lab: ...`` message, exit code 2.

    python train.py -m optim=adam,zero_adam dist.world_size=2,0   # job 4 named, nothing started
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from zero_lab.app.check.before_start import check_external_world, fail, share_run_dir
from zero_lab.app.check.rules import ConfigError, check
from zero_lab.app.config.problems import describe_hydra_error
from zero_lab.app.config.schema import enum_str
from zero_lab.app.plan.run_plan import RunPlan
from zero_lab.app.record.checkpoint_finder import find_any, is_dcp
from zero_lab.app.record.objective import check_directions
from zero_lab.app.run.checkpoints import read_dcp_extra
from zero_lab.app.run.rank_loop import RANK_PRELOAD
from zero_lab.app.workloads.torch_extras import model_extras_problem
from zero_lab.checkpoint import CheckpointError
from zero_lab.dcp_check import check_files, check_fits, check_state_names
from zero_lab.dcp_record import RECORD
from zero_lab.runtime import external
from zero_lab.runtime.spawn import start_forkserver

__all__ = [
    "CheckConfig",
    "check_run",
    "check_sweep",
    "check_unless_checked",
    "composed",
    "expand_sweep",
    "job_config",
    "refuse_bad_dcp_resume",
    "was_checked",
]

#: The jobs of a sweep checked before it starts (the rest as each starts).
MAX_JOBS = 64


@dataclass
class _Record:
    """What this process's callbacks saw: that Hydra composed the command, and each job config that
    passed, by fingerprint, with its plan (only the newest MAX_JOBS plans kept, the others ``None``)."""

    composed: bool = False
    plans: dict[str, RunPlan | None] = field(default_factory=dict)


_SEEN = _Record()


def _fingerprint(cfg: DictConfig) -> str:
    """A short digest of the job config as composed (unresolved), to recognise it in the task."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg).encode()).hexdigest()[:16]


def was_checked(cfg: DictConfig) -> bool:
    """True when a check of this process passed this job config (``cfg``: without its hydra node)."""
    return _fingerprint(cfg) in _SEEN.plans


def composed() -> bool:
    """True once Hydra composed this process's command (the check callback ran)."""
    return _SEEN.composed


def job_config(config: DictConfig) -> DictConfig:
    """``config`` without its hydra node: what the task receives (as Hydra's ``run_job`` makes it)."""
    cfg = copy.deepcopy(config)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _check_job(cfg: DictConfig, hydra: DictConfig, job: str | None = None) -> RunPlan:
    """Check one job (``cfg``; ``hydra``: its hydra node), record it and keep its plan; returns the
    plan; raises ConfigError naming ``job``."""
    try:
        if extras := model_extras_problem(str(cfg.model.get("_target_"))):  # torchvision: one line, not N
            raise ConfigError([extras])
        plan = check(cfg, OmegaConf.to_container(hydra.runtime.choices))  # type: ignore[arg-type]
        directions = hydra.sweeper.get("direction")  # Optuna's; other sweepers have none
        if directions is not None and (problems := check_directions(cfg.objective, directions)):
            raise ConfigError(problems)
    except ConfigError as error:
        raise ConfigError(error.problems, job=job) from None
    resume = cfg.get("resume")  # a DCP checkpoint to resume: its files and fit, one line if not
    refuse_bad_dcp_resume(resume, enum_str(cfg.get("resume_optimizer", "strict")), plan)
    plan.release_data()  # the task reads the plan's model, specs and partition, not the data source
    _SEEN.plans.pop(fingerprint := _fingerprint(cfg), None)  # to the end: the newest
    _SEEN.plans[fingerprint] = plan
    for old in [k for k, kept in _SEEN.plans.items() if kept is not None][:-MAX_JOBS]:  # a long Optuna study
        _SEEN.plans[old] = None
    return plan


def check_run(config: DictConfig) -> DictConfig:
    """Check the one job Hydra composed (``config``, with its hydra node); return the job config
    checked (``config`` without its hydra node). Raises ConfigError."""
    cfg = job_config(config)
    _check_job(cfg, config.hydra)
    return cfg


def expand_sweep(config: DictConfig) -> list[list[str]]:
    """The override list of every job the configured sweeper will launch for ``config`` (a
    ``-m`` command as Hydra composed it): ``hydra.sweeper.params`` and the command's overrides,
    split by the sweeper's own ``split_arguments`` (the basic sweeper's cartesian product). A
    sweeper that draws its jobs itself (Optuna) has none: the one job of the fixed overrides."""
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    overrides = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(arguments)
    split = getattr(get_class(config.hydra.sweeper._target_), "split_arguments", None)
    if split is None:
        return [[o.input_line for o in overrides if not o.is_sweep_override()]]
    return [job for batch in split(overrides, None) for job in batch]


def check_sweep(config: DictConfig) -> list[DictConfig]:
    """Compose and check every job of a sweep (up to :data:`MAX_JOBS`) as its launcher will;
    return the jobs' configs. Raises ConfigError naming the job (its overrides)."""
    try:
        jobs = expand_sweep(config)
    except HydraException as error:  # e.g. interval(...) without a sweeper that draws from it
        raise ConfigError([describe_hydra_error(error)]) from None
    loader = GlobalHydra.instance().config_loader()
    configs = []
    for overrides in jobs[:MAX_JOBS]:
        name = " ".join(overrides) if len(jobs) > 1 else None
        try:
            job = loader.load_sweep_config(config, list(overrides))
        except (HydraException, OmegaConfBaseException) as error:
            raise ConfigError([describe_hydra_error(error)], job=name) from None
        _check_job(job_config(job), job.hydra, name)
        configs.append(job)
    return configs


def check_unless_checked(cfg: DictConfig, hydra: DictConfig, world: external.ExternalWorld | None) -> RunPlan:
    """The task's check (``cfg``, ``hydra``: HydraConfig's node): only a job no callback of this
    process checked; under the Slurm launcher's multi-node mode also its world. Exits on a
    problem; returns the job's :class:`~zero_lab.app.plan.run_plan.RunPlan` (the check's own)."""
    if was_checked(cfg):  # its plan let go after MAX_JOBS newer jobs: plan it, not check it
        return _SEEN.plans[_fingerprint(cfg)] or RunPlan.of(cfg)
    try:
        if world is not None:
            check_external_world(cfg, list(hydra.overrides.task), False, world)
        return _check_job(cfg, hydra)
    except ConfigError as error:
        fail(error)


def refuse_bad_dcp_resume(resume: str | None, resume_optimizer: str, plan: RunPlan) -> None:
    """Check the DCP checkpoint ``resume`` names, if any, from its files and ``.metadata`` alone
    (:mod:`zero_lab.dcp_check`: its integrity record, the metadata unpickled with DCP's classes only,
    every ``.distcp`` file there and long enough) and against the plan's meta model (every tensor's
    shape and dtype; with the optimizer loaded, i.e. ``resume_optimizer`` other than ``reset``, no state
    of a parameter the model lacks). A problem ends the job with one ``zero_lab: resume: checkpoint ...:
    <file>: <cause>`` line (exit code 2); a checkpoint without an integrity record (torch's ``dcp.save``
    alone) loads after a one-line note. The config check calls it for ``resume=``, and a job Slurm
    requeued for the checkpoint it resumes by itself
    (:func:`zero_lab.app.launch.task.continue_requeued_run`)."""
    if resume is None:
        return
    found = find_any(Path(str(resume)).expanduser())
    if found is None or not is_dcp(found):
        return  # no checkpoint is the config check's problem; the native format is checked as it loads
    try:
        metadata, verified = check_files(found)
        read_dcp_extra(found)
        model = plan.model.value
        if model is not None:  # no model: the config check reported it
            check_fits(found, metadata, {"model": model.state_dict()}, strict=("model",))
            if resume_optimizer != "reset":
                check_state_names(found, metadata, "optim.state", [name for name, _ in model.named_parameters()])
    except CheckpointError as error:
        fail(f"resume: {error}")  # the error names the checkpoint, the file and the cause
    if not verified and external.rank() == 0:
        print(
            f"zero_lab: note: checkpoint {found} has no integrity record ({RECORD}): it was written by another "
            "tool or an older zero_lab, or copied without it; its files are loaded unverified",
            file=sys.stderr,
            flush=True,
        )


class CheckConfig(Callback):
    """Hydra callback: check the composed config before Hydra creates anything (module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _SEEN.composed = True
        world = external.detect(port=config.dist.master_port)
        if world is None:  # this job will start its ranks: their imports run on another core during the check
            start_forkserver(*RANK_PRELOAD)
        try:
            if world is not None:
                os.environ.setdefault("LOCAL_RANK", str(world.local_rank))  # srun's: the check counts no ranks per core
                check_external_world(config, list(config.hydra.overrides.task), False, world)
                config.dist.world_size = world.world_size
            check_run(config)
        except ConfigError as error:
            fail(error)
        if world is not None:
            share_run_dir(config, world)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _SEEN.composed = True
        try:
            if (world := external.detect(port=config.dist.master_port)) is not None:
                check_external_world(config, list(config.hydra.overrides.task), True, world)
            check_sweep(config)
        except ConfigError as error:
            fail(error)
