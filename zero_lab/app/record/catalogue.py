"""The metric catalogue: every figure a run records, with its unit, meaning and where it shows.

The one place a metric's name and key are spelled; every writer and reader (the loop, the
summary, W&B, the closing lines, the report, the sweeper's objective) takes them from here
(``tests/unit/test_metric_catalogue.py`` finds no other module spelling one).

* ``name`` — the field of :class:`~zero_lab.app.record.metrics.RankStep` a rank measures each
  step, and of :class:`~zero_lab.app.record.summary.RunSummary` where summary.json holds it;
* ``key`` — its namespaced key in ``metrics.jsonl`` and W&B. A ``per_rank`` metric is recorded
  as ``<key>/rank{r}``, ``<key>/max`` and ``<key>/mean`` (:meth:`Metric.at`); ``median`` names
  the summary field that holds the median over the timed steps (every step but the first) of
  its slowest rank, :data:`SUMMARY_LISTS` those summary.json holds as a list by rank;
* ``shows`` — ``wandb`` (each logged step, in metrics.jsonl too), ``summary`` (summary.json and
  W&B's summary), ``closing`` (the lines a job ends with), ``report`` (its table, plots, notes);
* ``objective`` — a sweeper may ``minimize``/``maximize`` the summary's value (``objective=``).

    STEP_S.at("max")          # "time/step_s/max"
    STEP_S.median             # "step_time_s", summary.json's median of it
"""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
__all__ = [
    "CATALOGUE", "DDP_STATE_BYTES", "EXCHANGE_BYTES", "EXCHANGE_CALLS", "EXCHANGE_EXPOSED_S",
    "EXCHANGE_INTER_GROUP_BYTES", "EXCHANGE_INTER_NODE_BYTES", "EXCHANGE_MODE", "EXCHANGE_S", "EXCHANGE_SENT_BYTES",
    "FINAL_LOSS", "GRAD_BYTES", "GRAD_NORM", "GRAD_REDUCE_BYTES", "GRAD_REDUCE_EXPOSED_S",
    "GRAD_REDUCE_INTER_GROUP_BYTES", "GRAD_REDUCE_INTER_NODE_BYTES", "GRAD_REDUCE_S", "IMBALANCE", "LOSS", "LR",
    "MASTER_WEIGHT_BYTES", "OPTIM_STATE_BYTES", "OPTIM_STEP_S", "PEAK_BYTES", "PER_RANK", "SAMPLES_PER_S",
    "STATE_VS_DDP", "STEP_S", "SUMMARY_LISTS", "TENSOR_BYTES", "VAL_LOSS", "Metric",
]
# fmt: on

WANDB, SUMMARY, CLOSING, REPORT = "wandb", "summary", "closing", "report"


@dataclass(frozen=True)
class Metric:
    """One recorded figure (module docstring)."""

    name: str
    unit: str  # "s", "B", "1" (a count or ratio), "samples/s", "loss", "lr", "mode"
    meaning: str
    shows: tuple[str, ...]
    key: str | None = None  # None: summary.json only
    per_rank: bool = False
    median: str | None = None  # the summary field of the median over the timed steps of <key>/max
    objective: str | None = None  # "minimize" / "maximize"

    def at(self, which: str) -> str:
        """``<key>/<which>``: ``which`` is ``max``, ``mean`` or ``rank{r}`` (also ``min`` in W&B's summary)."""
        return f"{self.key}/{which}"


def _timed(name: str, key: str, meaning: str, *shows: str, median: str | None = None) -> Metric:
    return Metric(name, "s", meaning, (WANDB, *shows), key, True, median, "minimize" if median else None)


def _bytes(name: str, key: str, meaning: str, *shows: str, median: str | None = None) -> Metric:
    return Metric(name, "B", meaning, (WANDB, *shows), key, True, median)


# fmt: off
LOSS = Metric("loss", "loss", "the step's loss, mean over ranks (train/loss/rank{r}: each rank's)", (WANDB,),
              "train/loss")
STEP_S = _timed("step_s", "time/step_s", "a rank's whole step: forward, backward, optimizer step, exchange",
                SUMMARY, CLOSING, REPORT, median="step_time_s")
EXCHANGE_S = _timed("exchange_s", "time/exchange_s", "the parameter exchange in flight (ZeRO)",
                    SUMMARY, CLOSING, REPORT, median="exchange_time_s")
EXCHANGE_EXPOSED_S = _timed("exchange_exposed_s", "comm/exchange_exposed_s",
                            "of the exchange, what the loop waited for (prefetch and overlap hide the rest)",
                            SUMMARY, CLOSING, median="exchange_exposed_s")
OPTIM_STEP_S = _timed("optim_step_s", "time/optim_step_s", "the local optimizer step alone (ZeRO: own shards, no "
                      "exchange); max against mean: the partition's cost imbalance", SUMMARY, CLOSING, REPORT)
GRAD_REDUCE_S = _timed("grad_reduce_s", "time/grad_reduce_s", "the gradient reduction in flight (grad_reduce=)",
                       SUMMARY)
GRAD_REDUCE_EXPOSED_S = _timed("grad_reduce_exposed_s", "comm/grad_reduce_exposed_s",
                               "of the gradient reduction, what backward waited for at its end", SUMMARY)
EXCHANGE_BYTES = _bytes("exchange_bytes", "comm/exchange_bytes", "the parameters the exchange moved (the model's)",
                        SUMMARY, CLOSING, REPORT, median="exchange_bytes_per_step")
EXCHANGE_CALLS = Metric("exchange_calls", "1", "the exchange's collective calls", (WANDB,), "comm/exchange_calls", True)
EXCHANGE_SENT_BYTES = _bytes("exchange_sent_bytes", "comm/exchange_sent_bytes", "bytes a rank sent exchanging",
                             SUMMARY, CLOSING, REPORT)
GRAD_REDUCE_BYTES = _bytes("grad_reduce_bytes", "comm/grad_reduce_bytes", "bytes a rank sent reducing gradients "
                           "(grad_reduce=; DDP's own all-reduce is not metered)", SUMMARY, CLOSING, REPORT)
GRAD_REDUCE_INTER_GROUP_BYTES = _bytes("grad_reduce_inter_group_bytes", "comm/grad_reduce_inter_group_bytes",
                                       "of grad_reduce_bytes, what crossed shard groups", SUMMARY, REPORT)
GRAD_REDUCE_INTER_NODE_BYTES = _bytes("grad_reduce_inter_node_bytes", "comm/grad_reduce_inter_node_bytes",
                                      "of grad_reduce_bytes, what crossed nodes", SUMMARY, REPORT)
EXCHANGE_INTER_GROUP_BYTES = _bytes("exchange_inter_group_bytes", "comm/exchange_inter_group_bytes",
                                    "of exchange_sent_bytes, what crossed shard groups", SUMMARY, REPORT)
EXCHANGE_INTER_NODE_BYTES = _bytes("exchange_inter_node_bytes", "comm/exchange_inter_node_bytes",
                                   "of exchange_sent_bytes, what crossed nodes", SUMMARY, REPORT)
OPTIM_STATE_BYTES = Metric("optim_state_bytes", "B", "optimizer-state tensors on a rank",
                           (WANDB, SUMMARY, CLOSING, REPORT), "memory/optim_state_bytes", True, objective="minimize")
MASTER_WEIGHT_BYTES = _bytes("master_weight_bytes", "memory/master_weight_bytes", "fp32 master weights", SUMMARY)
TENSOR_BYTES = _bytes("tensor_bytes", "memory/tensor_bytes", "params + grads + buffers + state + master weights",
                      SUMMARY, REPORT)
PEAK_BYTES = _bytes("peak_bytes", "memory/peak_bytes", "process peak: CUDA allocated, else RSS", SUMMARY, REPORT)
GRAD_BYTES = _bytes("grad_bytes", "memory/grad_bytes", "gradients held after backward (release_grads=true: owned only)",
                    SUMMARY, CLOSING, REPORT)
SAMPLES_PER_S = Metric("samples_per_s", "samples/s", "global batch / the slowest rank's step", (WANDB, SUMMARY, REPORT),
                       "train/samples_per_s", median="samples_per_s", objective="maximize")
IMBALANCE = Metric("imbalance", "1", "the partition's max / ideal (1.0: plain optimizers)",
                   (WANDB, SUMMARY, CLOSING, REPORT), "memory/imbalance")
GRAD_NORM = Metric("grad_norm", "1", "global gradient norm before clipping (optim.max_grad_norm)", (WANDB,),
                   "train/grad_norm")
LR = Metric("lr", "lr", "param group 0's learning rate for the next step (scheduler=)", (WANDB,), "train/lr")
VAL_LOSS = Metric("val_loss", "loss", "held-out loss (eval_every=); summary: final_val_loss, best_val_loss",
                  (WANDB, SUMMARY, CLOSING, REPORT), "val/loss")
EXCHANGE_MODE = Metric("exchange_mode", "mode", "the exchange's collective (exchange=auto: its choice), from step 0",
                       (WANDB, SUMMARY), "comm/exchange_mode")
STATE_VS_DDP = Metric("state_vs_ddp", "1", "fullest rank's state / DDP + the same optimizer's", (SUMMARY,),
                      "memory/state_vs_ddp")
DDP_STATE_BYTES = Metric("ddp_state_bytes", "B", "planned: DDP + the same optimizer's state per rank",
                         (SUMMARY, CLOSING, REPORT), "memory/ddp_state_bytes")
FINAL_LOSS = Metric("final_loss", "loss", "the last step's loss", (SUMMARY, CLOSING, REPORT), objective="minimize")

#: Every metric, the per-rank ones in :class:`~zero_lab.app.record.metrics.RankStep`'s order.
CATALOGUE: tuple[Metric, ...] = (
    LOSS, STEP_S, EXCHANGE_S, EXCHANGE_EXPOSED_S, EXCHANGE_BYTES, EXCHANGE_CALLS, OPTIM_STATE_BYTES,
    MASTER_WEIGHT_BYTES, TENSOR_BYTES, PEAK_BYTES, OPTIM_STEP_S, GRAD_REDUCE_BYTES, EXCHANGE_SENT_BYTES,
    GRAD_REDUCE_S, GRAD_REDUCE_EXPOSED_S, GRAD_BYTES, GRAD_REDUCE_INTER_GROUP_BYTES, GRAD_REDUCE_INTER_NODE_BYTES,
    EXCHANGE_INTER_GROUP_BYTES, EXCHANGE_INTER_NODE_BYTES, SAMPLES_PER_S, IMBALANCE, GRAD_NORM, LR, VAL_LOSS,
    EXCHANGE_MODE, STATE_VS_DDP, DDP_STATE_BYTES, FINAL_LOSS,
)
#: summary.json's lists by rank, under each ``name`` (the last step's; the local optimizer step: each rank's median).
SUMMARY_LISTS = (OPTIM_STATE_BYTES, MASTER_WEIGHT_BYTES, TENSOR_BYTES, PEAK_BYTES, OPTIM_STEP_S, GRAD_BYTES)
# fmt: on
#: The metrics each rank measures every step as ``<key>/rank{r}``, ``/max``, ``/mean``.
PER_RANK: tuple[Metric, ...] = tuple(m for m in CATALOGUE if m.per_rank)
