"""The default job shows what ZeRO is for: its closing lines against its own files (the engine trained:
``dp=auto`` resolved for ``optim=zero_adam``), and the planner's "DDP + the same Adam would hold" against a
real plain-Adam run of the same model."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.runs import summary

MIB = 2**20


def closing_block(stdout: str, run_dir: Path, count: int) -> list[str]:
    """The ``count`` lines from ``zero_lab: final loss`` to ``run dir: <run_dir>``."""
    lines = stdout.splitlines()
    end = lines.index(f"  run dir: {run_dir}")
    first = end - count + 1
    assert lines[first].startswith("zero_lab: final loss"), lines[first : end + 1]
    return lines[first : end + 1]


def test_default_job_ends_with_loss_state_saved_exchange_share_and_the_engine(default_run, sweep):
    ran = summary(default_run)
    block = closing_block((default_run / ".done").read_text(), default_run, 6)
    final, state, exchange, engine, held_grads, _ = block
    assert final.startswith(f"zero_lab: final loss {ran['final_loss']:.6g} after 20 steps on 2 rank(s)")

    held, plain = max(ran["optim_state_bytes"]), ran["ddp_state_bytes"]
    assert held >= 2 * MIB  # the default model's state is MiB, not KiB
    adam = summary(sweep / "0")  # plain DDP + Adam on the same model at W=2, measured
    assert plain == adam["optim_state_bytes"][0] == adam["optim_state_bytes"][1]  # the planner is exact
    assert f"{held / MIB:.2f} MiB on the fullest of 2 rank(s) (imbalance {ran['imbalance']:.2f})" in state
    baseline = f"DDP + the same Adam would hold {plain / MIB:.2f} MiB on every rank (planner): ÷ {plain / held:.2f}"
    assert baseline in state
    assert 1.95 <= plain / held <= 2.0  # sorted-greedy splits the four layers evenly

    share = ran["exchange_time_s"] / ran["step_time_s"]
    assert 0 < share < 1
    assert exchange.startswith(f"  parameter exchange: {share:.0%} of the step (median ")
    volume = f"{ran['exchange_bytes_per_step'] / MIB:.2f} MiB of parameters exchanged per step (the model's)"
    assert exchange.endswith(volume), exchange  # the engine's own exchange: no step-1 trial to report
    assert ran["exchange"] is None

    assert ran["dp"] == "zero_lab" and ran["dp_choice"]["requested"] == "auto", ran["dp_choice"]
    modes = ran["engine"]
    assert engine == (
        f"  data parallel: zero_lab.ShardedDataParallel ({ran['dp_choice']['reason']}): "
        f"grad_reduce={modes['grad_reduce']}, exchange={modes['exchange']}, prefetch=false, "
        f"{modes['buckets']} bucket(s) of at most {modes['bucket_cap_mb']} MiB, partitioner {modes['partitioner']}"
    )
    assert (
        held_grads.startswith("  gradients held on rank 0: ")
        and 0 < modes["peak_grad_bytes"] <= modes["grad_hold_bound"]
    )


def test_a_plain_optimizer_run_says_every_rank_holds_all_of_it(sweep):
    adam = summary(sweep / "0")
    _, state, exchange, data_parallel, _ = closing_block((sweep / ".done").read_text(), sweep / "0", 5)
    assert (
        state
        == f"  optimizer state per rank: {adam['optim_state_bytes'][0] / MIB:.2f} MiB, all of it on every rank "
        + "(DDP + Adam; a zero_* optimizer shards it)"
    )
    assert exchange == "  parameter exchange: none (plain DDP: every rank steps every parameter)"
    why = "dp=auto: a plain Adam, its whole state on every rank"
    assert data_parallel == f"  data parallel: torch's DDP ({why})"
    assert adam["dp_choice"] == {"dp": "ddp", "requested": "auto", "reason": why}
