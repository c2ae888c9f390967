"""What a run ends with: :class:`RunSummary`, its ``summary.json``.

Pure (no torch, no Hydra), so every reader imports it: the loop writes one; the objective, the
closing lines, the W&B summary and the report read one. Its metrics' names, units and meanings
are the catalogue's (:mod:`zero_lab.app.record.catalogue`). ``summary.json`` is
:meth:`RunSummary.as_dict`, key for key and in this order (scripts and dashboards read it);
:meth:`RunSummary.from_dict` reads it back, an older run's missing keys as ``None``::

    summary = RunSummary.read(run_dir / SUMMARY_FILE)
    summary.final_loss, max(summary.optim_state_bytes), summary.as_dict()["step_time_s"]
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zero_lab.app.record.run_files import SUMMARY_FILE

__all__ = ["PROVENANCE", "SUMMARY_FILE", "RunSummary"]

#: The job's ``meta.json`` entries the summary repeats, so a summary alone says what ran.
PROVENANCE: tuple[str, ...] = ("choices", "git", "command", "name", "group", "requeued")


@dataclass
class RunSummary:
    """``summary.json``: what one finished (or signal-stopped) run measured. Medians are over
    the steps after the first (it pays one-off costs), of the slowest rank."""

    final_loss: float
    losses: list[float]
    world_size: int
    steps: int
    param_checksum: str | None = None
    start_step: int = 0
    resumed_from: str | None = None
    resumed_checkpoint: str | None = None  # the step dir resume= named (or found in the run dir it named)
    zero: bool = False
    dp: str = "ddp"  # the path that trained: ddp (torch's DDP) or zero_lab (zero_lab.ShardedDataParallel)
    dp_choice: dict[str, str] | None = None  # dp= as asked (auto, ddp, zero_lab), as resolved, and why (DpChoice)
    engine: dict[str, Any] | None = None  # dp=zero_lab: the engine's modes and rank 0's gradient bytes held (modes())
    bucket_view: bool = False
    overlap: bool = False
    exchange_mode: str | None = None  # the collective the exchange used (exchange=auto: the one it chose)
    exchange: dict[str, Any] | None = None  # ExchangeReport.as_dict() (zero_*)
    prefetch: bool = False
    model_params: int | None = None
    global_batch: int | None = None
    param_dtype: str | None = None
    master_weights: bool = False
    max_grad_norm: float | None = None
    optim_state_bytes: list[float] = field(default_factory=list)  # the last step's, per rank
    master_weight_bytes: list[float] = field(default_factory=list)
    tensor_bytes: list[float] = field(default_factory=list)
    peak_bytes: list[float] = field(default_factory=list)
    ddp_state_bytes: int | None = None  # planned: what DDP + the same optimizer holds per rank (parameters with state)
    optimizer_classes: list[str] | None = None  # the classes holding the state, in param-group order (Muon, AdamW)
    elementwise: bool | None = None  # every one of them steps element by element (False: Muon's whole matrices)
    imbalance: float | None = None  # the partition's max / ideal (1.0 for plain optimizers)
    step_time_s: float | None = None
    exchange_time_s: float | None = None
    exchange_exposed_s: float | None = None  # of exchange_time_s, what the loop waited for
    exchange_bytes_per_step: float | None = None
    samples_per_s: float | None = None
    final_val_loss: float | None = None
    best_val_loss: float | None = None  # the lowest val/loss of this run's evaluations
    accumulate: int = 1
    eval_every: int = 0  # 0: no validation
    eval_batches: int | None = None  # held-out batches per validation (with eval_every)
    autocast: str | None = None
    compile: bool = False
    compiled_graphs: int | None = None
    optim_step_s: list[float] | None = None  # each rank's median local optimizer step
    optim_step_max_over_mean: float | None = None
    state_vs_ddp: float | None = None
    partition: dict[str, Any] | None = None  # PartitionReport.as_dict() (zero_*; absent otherwise)
    shard_size: int | None = None  # dist.shard_size: the state sharded over groups of this many ranks (null: all)
    provenance: dict[str, Any] = field(default_factory=dict)  # PROVENANCE entries, at the top level of the file
    stopped_by: str | None = None  # the signal that stopped the run early
    resume_optimizer: str | None = None  # with resume=: the policy (absent otherwise)
    resume_overridden: dict[str, list[Any]] | None = None  # resume_optimizer=override: {"group0.lr": [saved, now]}
    # grad_reduce=: GradReduceHandle.report() (the strategy, auto's timings); None without it
    grad_reduce: dict[str, Any] | None = None
    release_grads: bool = False
    grad_bytes: list[float] = field(default_factory=list)  # gradient storage held after the last backward, per rank
    # bytes each rank sent per step by phase (median over the timed steps, measured by the Communicator):
    # {"grad_reduce": [per rank] (null without grad_reduce=), "param_exchange": [per rank]}
    bytes_per_step: dict[str, list[float] | None] | None = None
    # the same bytes by link class: {phase: {"intra_group"|"inter_group"|"intra_node"|"inter_node": [per rank]}}
    # (inter_group: across dist.shard_size groups; inter_node: a group spanning nodes, as the launcher says)
    bytes_per_link: dict[str, dict[str, list[float]] | None] | None = None
    # seconds per phase (median over the timed steps, slowest rank): the gradient reduction in flight and what
    # of it backward waited for at its end, the exchange in flight and what of it the loop waited for
    phase_time_s: dict[str, float | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``summary.json`` object: every field in order, ``provenance`` spread into it;
        ``partition`` only for ZeRO, the ``resume_*`` keys only for a resumed run."""
        absent = {"partition"} if self.partition is None else set()
        if self.resume_optimizer is None:
            absent |= {"resume_optimizer", "resume_overridden"}
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "provenance":
                out.update(self.provenance)
            elif f.name not in absent:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSummary:
        """A summary from ``summary.json``'s object; keys it does not know are ignored."""
        known = {f.name for f in dataclasses.fields(cls)} - {"provenance"}
        kept = {k: v for k, v in values.items() if k in known}
        return cls(**kept, provenance={k: v for k, v in values.items() if k in PROVENANCE})

    @classmethod
    def read(cls, path: str | Path) -> RunSummary:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    @property
    def choices(self) -> dict[str, Any]:
        """The group options of the job (``optim``: ``zero_adam``, ...), ``{}`` when not recorded."""
        return dict(self.provenance.get("choices") or {})
