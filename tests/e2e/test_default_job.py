"""The default job shows what ZeRO is for: its closing lines against its own files, and the
planner's "DDP + the same Adam would hold" against a real plain-Adam run of the same model."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.runs import summary

MIB = 2**20


def closing_block(stdout: str, run_dir: Path) -> list[str]:
    """The four lines from ``zero_lab: final loss`` to ``run dir: <run_dir>``."""
    lines = stdout.splitlines()
    end = lines.index(f"  run dir: {run_dir}")
    assert lines[end - 3].startswith("zero_lab: final loss"), lines[end - 3 : end + 1]
    return lines[end - 3 : end + 1]


def test_default_job_ends_with_loss_state_saved_and_exchange_share(default_run, sweep):
    ran = summary(default_run)
    final, state, exchange, _ = closing_block((default_run / ".done").read_text(), default_run)
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
    auto = ran["exchange"]  # the default exchange=auto: the line names its choice and any near-tie
    assert auto["requested"] == "auto" and auto["collective"] in ("broadcast", "p2p_all_gather"), auto
    chose = f"; exchange=auto chose {auto['collective']}"
    if auto["within_noise"]:
        chose += f"; {', '.join(auto['within_noise'])} within the noise of it, the preferred one kept"
    assert exchange.endswith(volume + chose), (exchange, auto)


def test_a_plain_optimizer_run_says_every_rank_holds_all_of_it(sweep):
    adam = summary(sweep / "0")
    _, state, exchange, _ = closing_block((sweep / ".done").read_text(), sweep / "0")
    assert (
        state
        == f"  optimizer state per rank: {adam['optim_state_bytes'][0] / MIB:.2f} MiB, all of it on every rank "
        + "(DDP + Adam; a zero_* optimizer shards it)"
    )
    assert exchange == "  parameter exchange: none (plain DDP: every rank steps every parameter)"
