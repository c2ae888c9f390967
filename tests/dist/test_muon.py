"""Muon / Adafactor beside AdamW in one ZeroRedundancyOptimizer, against DDP + torch's own
chained optimizers, on real Gloo worlds: one W=2 world runs every parity case and saves a
checkpoint per matrix class (Muon, Adafactor), one W=3 world resumes both with the other
cost model (two worlds in all).

Every case is bitwise (``max_diff == 0.0``): ZeRO steps each parameter whole with the same
class and arithmetic as the plain chain, except clipping: the sharded norm is summed in
another order (~1e-7 relative), and torch's Muon runs Newton–Schulz in bf16, where such a
difference can flip a rounding (2^-8 relative) and move a matrix by ~lr·2^-8 per step —
measured 4.7e-4 after 4 steps at lr 0.02, hence ``CLIP_TOLERANCE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import Manual, SortedGreedy, ZeroRedundancyOptimizer, muon_param_groups, split_state_dict
from zero_lab.checkpoint import export_plain_state_dict, load_checkpoint, save_checkpoint
from zero_lab.overlap import hook_with_zero_step_interleaved, prefetch_exchange
from zero_lab.partition import DdpBucket, Partitioner

STEPS, SAVE_AT, TOTAL = 4, 3, 6
MUON = {"lr": 0.02}
ADAMW = {"lr": 3e-3, "weight_decay": 0.05}
CLIP_TOLERANCE = STEPS * MUON["lr"] * 2**-6  # 1.25e-3: a few bf16 roundings flipped per step


@dataclass
class MuonCase:
    partitioner: Partitioner | None = None
    matrix_class: type[torch.optim.Optimizer] = torch.optim.Muon
    bucket_view: bool = False
    prefetch: bool = False
    overlap: bool = False
    scheduler: bool = False
    clip: float | None = None
    join: bool = False
    round_trip: bool = False  # state dict through the plain chained optimizers and back, mid-run
    shard_size: int | None = None  # hierarchical sharding (tests/dist/test_hierarchy.py runs it at 2 x 2)


class MixedLM(nn.Module):
    """A small LM whose matrices' numel and Newton–Schulz cost disagree: per block a wide
    ``up`` (256, 32), a ``squeeze`` (8, 256) with more elements but less cost than the
    square ``mix`` (32, 32), an ``expand`` (32, 8); norms and biases; an untied head."""

    def __init__(self, vocab: int = 40, width: int = 32, layers: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm": nn.LayerNorm(width),
                    "up": nn.Linear(width, 256),
                    "squeeze": nn.Linear(256, 8),
                    "expand": nn.Linear(8, width),
                    "mix": nn.Linear(width, width, bias=False),
                }
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for block in self.blocks:
            z = block["norm"](h)
            h = h + block["expand"](F.gelu(block["squeeze"](F.gelu(block["up"](z))))) + block["mix"](z).tanh()
        return self.head(h)


def lm(seed: int = 0) -> MixedLM:
    torch.manual_seed(seed)
    return MixedLM()


def tokens(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1000 * step + rank))


def lm_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    logits = model(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def matrix_hyper(case: MuonCase) -> dict[str, Any]:
    return MUON if case.matrix_class is torch.optim.Muon else {"lr": 1e-2}


def groups(model: nn.Module, case: MuonCase) -> list[dict[str, Any]]:
    """The ZeRO side's groups: zero_lab's own routing."""
    return muon_param_groups(model, muon=matrix_hyper(case), adamw=ADAMW, muon_class=case.matrix_class)


def routed_by_hand(model: MixedLM) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The reference's routing, written out from the model rather than by ``muon_param_groups``
    (a routing bug would otherwise hit both sides alike): every block's four weight matrices to
    the matrix class; the embedding, the head, the norms and the biases to AdamW; each list in
    registration order (the order a state dict numbers them)."""
    matrices = [block[name].weight for block in model.blocks for name in ("up", "squeeze", "expand", "mix")]
    chosen = {id(p) for p in matrices}
    return matrices, [p for p in model.parameters() if id(p) not in chosen]


def plain_chain(model: nn.Module, case: MuonCase) -> list[torch.optim.Optimizer]:
    """torch's own classes, routed by hand: the matrix class, then AdamW."""
    assert isinstance(model, MixedLM)
    matrices, rest = routed_by_hand(model)
    return [case.matrix_class(matrices, **matrix_hyper(case)), torch.optim.AdamW(rest, **ADAMW)]


def build(case: MuonCase, zero: bool) -> tuple[DDP, list[torch.optim.Optimizer], Any]:
    model = lm()
    ddp = DDP(model)
    if not zero:
        return ddp, plain_chain(model, case), None
    opt = ZeroRedundancyOptimizer(
        groups(model, case),
        torch.optim.AdamW,
        partitioner=case.partitioner,
        parameters_as_bucket_view=case.bucket_view,
        overlap_with_ddp=case.overlap,
        shard_size=case.shard_size,
    )
    if case.overlap:
        ddp.register_comm_hook(None, hook_with_zero_step_interleaved(allreduce_hook, ddp, opt))
    handle = prefetch_exchange(model, opt) if case.prefetch else None
    return ddp, [opt], handle


def train(case: MuonCase, zero: bool, steps: int = STEPS) -> tuple[nn.Module, list[torch.optim.Optimizer], list[float]]:
    ddp, opts, handle = build(case, zero)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts] if case.scheduler else []
    rank = dist.get_rank()
    batches = steps - 2 if case.join and rank == 1 else steps  # uneven inputs: rank 1 runs out first
    losses = []
    joinables = [ddp, *opts] if zero else [ddp]
    with Join(joinables, enable=case.join):
        for step in range(batches):
            for opt in opts:
                opt.zero_grad()
            loss = lm_loss(ddp, tokens(step, rank))
            loss.backward()
            if case.clip is not None:
                if zero:
                    opts[0].clip_grad_norm_(case.clip)
                else:
                    torch.nn.utils.clip_grad_norm_(ddp.module.parameters(), case.clip)
            for opt in opts:
                opt.step()
            for scheduler in schedulers:
                scheduler.step()
            losses.append(loss.item())
            if case.round_trip and step == 1:
                round_trip(opts, case, zero)
    if handle is not None:
        handle.remove()
    return ddp.module, opts, losses


def round_trip(opts: list[torch.optim.Optimizer], case: MuonCase, zero: bool) -> None:
    """ZeRO: consolidate, load into fresh plain chained optimizers, and load theirs back."""
    if not zero:
        return
    opt = opts[0]
    assert isinstance(opt, ZeroRedundancyOptimizer)
    holder: list[Any] = [None]
    opt.consolidate_state_dict(to=0)
    if dist.get_rank() == 0:
        plain = plain_chain(lm(), case)
        params = [p for o in plain for g in o.param_groups for p in g["params"]]
        for o, part in zip(plain, split_state_dict(opt.state_dict())):
            o.load_state_dict(part)
        assert len([p for p in params if p in plain[0].state or p in plain[1].state]) == len(params)
        holder[0] = [o.state_dict() for o in plain]
    dist.broadcast_object_list(holder, src=0)
    opt.load_state_dict(holder[0])


def parity(cases: list[MuonCase], checkpoint: str) -> list[dict[str, Any]]:
    rows = []
    for case in cases:
        ours, zero_opts, zero_losses = train(case, zero=True)
        theirs, plain, ref_losses = train(case, zero=False)
        zero = zero_opts[0]
        assert isinstance(zero, ZeroRedundancyOptimizer)
        ref_state = [o.state_dict() for o in plain]
        zero.consolidate_state_dict(to=0)
        state_equal = None
        if dist.get_rank() == 0:
            parts = split_state_dict(zero.state_dict())
            state_equal = all(
                torch.equal(value, part["state"][index][key])
                for ref, part in zip(ref_state, parts)
                for index, entry in ref["state"].items()
                for key, value in entry.items()
                if torch.is_tensor(value)
            ) and [len(p["state"]) for p in parts] == [len(r["state"]) for r in ref_state]
        report = zero.partition.report(cost="newton_schulz")
        rows.append(
            {
                "max_diff": max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters())),
                "losses": (zero_losses, ref_losses),
                "state_equal": state_equal,
                "owners": zero.partition.owners(),
                "cost_per_rank": report.cost_per_rank,
                "classes": [type(o).__name__ for o in zero.optim.optimizers],
                "lr": [g["lr"] for g in zero.param_groups],
            }
        )
    rows.append({cls.__name__: save_for_resume(f"{checkpoint}/{cls.__name__}/step_00000003", cls) for cls in RESUMED})
    return rows


#: The matrix classes whose state is saved at W=2 and resumed at W=3.
RESUMED = (torch.optim.Muon, torch.optim.Adafactor)


def save_for_resume(directory: str, matrix_class: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """Cost-balanced ZeRO at W=2: save at SAVE_AT, keep training to TOTAL (the uninterrupted run)."""
    model = lm()
    ddp = DDP(model)
    case = MuonCase(matrix_class=matrix_class)
    opt = ZeroRedundancyOptimizer(
        groups(model, case), torch.optim.AdamW, partitioner=SortedGreedy(cost="newton_schulz")
    )
    losses = []
    for step in range(TOTAL):
        if step == SAVE_AT:
            save_checkpoint(directory, opt, model, extra={"step": step})
        opt.zero_grad()
        loss = lm_loss(ddp, tokens(step, dist.get_rank()))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


def resume_all(root: str) -> dict[str, Any]:
    """W=3: every class of :data:`RESUMED`, each from its own checkpoint."""
    return {cls.__name__: resume(f"{root}/{cls.__name__}/step_00000003", cls) for cls in RESUMED}


def resume(directory: str, matrix_class: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """W=3, numel-balanced: resume the W=2 checkpoint, and DDP + the plain chain from its export."""
    model = lm(seed=1)
    ddp = DDP(model)
    case = MuonCase(matrix_class=matrix_class)
    opt = ZeroRedundancyOptimizer(groups(model, case), torch.optim.AdamW, partitioner=SortedGreedy())
    extra = load_checkpoint(directory, opt, model)
    resumed = []
    for step in range(extra["step"], TOTAL):
        opt.zero_grad()
        loss = lm_loss(ddp, tokens(step, dist.get_rank()))
        loss.backward()
        opt.step()
        resumed.append(loss.item())
    states_held = [len(o.state) for o in opt.optim.optimizers]

    plain_model = lm(seed=2)
    plain_model.load_state_dict(torch.load(f"{directory}/model.pt", weights_only=True))
    plain_ddp = DDP(plain_model)
    plain = plain_chain(plain_model, case)
    exported = export_plain_state_dict(directory, f"{directory}-plain-rank{dist.get_rank()}.pt")
    state = torch.load(exported, weights_only=True)
    for o, part in zip(plain, split_state_dict(state, default_class=torch.optim.AdamW)):
        o.load_state_dict(part)
    reference = []
    for step in range(extra["step"], TOTAL):
        for o in plain:
            o.zero_grad()
        loss = lm_loss(plain_ddp, tokens(step, dist.get_rank()))
        loss.backward()
        for o in plain:
            o.step()
        reference.append(loss.item())
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), plain_model.parameters()))
    return {"resumed": resumed, "reference": reference, "max_diff": diff, "states_held": states_held}


CASES: dict[str, MuonCase] = {
    "sorted_greedy-numel": MuonCase(partitioner=SortedGreedy()),
    "sorted_greedy-cost": MuonCase(partitioner=SortedGreedy(cost="newton_schulz"), round_trip=True),
    "manual-order-cost": MuonCase(partitioner=Manual(order=["*"], cost="newton_schulz")),
    "bucket_view": MuonCase(partitioner=SortedGreedy(cost="newton_schulz"), bucket_view=True),
    "prefetch": MuonCase(partitioner=SortedGreedy(cost="newton_schulz"), prefetch=True, bucket_view=True),
    "overlap-interleaved": MuonCase(partitioner=DdpBucket(cost="newton_schulz"), overlap=True),
    "schedulers": MuonCase(scheduler=True),
    "join": MuonCase(partitioner=SortedGreedy(cost="newton_schulz"), join=True),
    "clip": MuonCase(clip=0.5),
    "adafactor": MuonCase(matrix_class=torch.optim.Adafactor, partitioner=SortedGreedy(cost="newton_schulz")),
    "adafactor-round-trip": MuonCase(matrix_class=torch.optim.Adafactor, round_trip=True, bucket_view=True),
}


@pytest.fixture(scope="module")
def results(world, tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("muon")
    rows = world(parity, 2, list(CASES.values()), str(checkpoint), timeout_s=300)
    by_case = {name: [rank_rows[i] for rank_rows in rows] for i, name in enumerate(CASES)}
    return by_case, [rank_rows[-1] for rank_rows in rows], checkpoint


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_and_state_match_ddp_plus_the_plain_chain(results, name):
    rows = results[0][name]
    tolerance = CLIP_TOLERANCE if CASES[name].clip is not None else 0.0
    for row in rows:
        assert row["max_diff"] <= tolerance, (name, row["max_diff"])
        assert row["losses"][0] == pytest.approx(row["losses"][1], abs=tolerance, rel=0)
    if tolerance == 0.0:
        assert rows[0]["state_equal"] is True  # Muon's momentum / Adafactor's factors, bitwise
    expected = "Muon" if CASES[name].matrix_class is torch.optim.Muon else "Adafactor"
    assert {tuple(row["classes"]) for row in rows} <= {(expected, "AdamW"), (expected,), ("AdamW",)}
    assert set(rows[0]["classes"] + rows[1]["classes"]) == {expected, "AdamW"}


def test_cost_balance_moves_owners_and_evens_the_newton_schulz_cost(results):
    by_case = results[0]
    numel = by_case["sorted_greedy-numel"][0]
    cost = by_case["sorted_greedy-cost"][0]
    assert numel["owners"] != cost["owners"]
    spread = [max(row["cost_per_rank"]) / (sum(row["cost_per_rank"]) / 2) for row in (numel, cost)]
    assert spread[1] < spread[0]
    assert by_case["schedulers"][0]["lr"] == [0.02 * 0.25, 3e-3 * 0.25]  # StepLR per group, 4 steps, gamma 0.5 / 2


@pytest.fixture(scope="module")
def resumed(world, results) -> dict[str, list[dict[str, Any]]]:
    """One W=3 world resumes every class's W=2 checkpoint: rows by class name, then by rank."""
    per_rank = world(resume_all, 3, str(results[2]), timeout_s=180)
    return {name: [row[name] for row in per_rank] for name in per_rank[0]}


@pytest.mark.parametrize("matrix_class", [cls.__name__ for cls in RESUMED])
def test_resume_at_three_ranks_with_the_other_cost_model(results, resumed, matrix_class):
    """Muon's momentum and Adafactor's factored state move whole to their new owners at W=3."""
    uninterrupted = results[1]
    for rank, row in enumerate(resumed[matrix_class]):
        assert row["max_diff"] == 0.0  # DDP + the plain chain from the exported state, same arithmetic
        assert row["resumed"] == row["reference"]
        if rank < 2:  # the restored parameters give the saved run's next loss on the same batch, bitwise
            assert row["resumed"][0] == uninterrupted[rank][matrix_class]["losses"][SAVE_AT]
    assert sum(sum(row["states_held"]) for row in resumed[matrix_class]) == len(list(lm().parameters()))
