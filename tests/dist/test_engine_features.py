"""The engine's features beyond the plain step, each against DDP + the same optimizer at W=2.

Sharded ``clip_grad_norm_`` (the total norm and the clipped training: bitwise with a
whole-parameter partitioner, 1e-6 with ``Flat``, whose parameters straddle ranks), for the 2-norm
and the inf-norm, with and without accumulation. Checkpoints: the consolidated state is DDP + Adam's
bitwise; a native and a DCP save at step 2, loaded into fresh engines, train on bitwise as the
uninterrupted run; a 2-rank checkpoint loads at 3 ranks (resharded) and trains on as DDP + Adam
loaded from its exported plain state. All cases of a world run in one world.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import zero_lab.dcp
from tests.dist.training import OPTIMIZERS, accumulated_backward, make_model, max_diff
from zero_lab import ChainedOptimizer, ShardedDataParallel, checkpoint, muon_param_groups
from zero_lab.partition import Flat, SortedGreedy

PARTITIONERS = {"flat": Flat, "sorted_greedy": SortedGreedy}


@dataclass(frozen=True)
class ClipCase:
    partitioner: str = "flat"
    max_norm: float = 0.05  # below the model's gradient norm: every step clips
    norm_type: float = 2.0
    accumulate: int = 1
    optimizer: str = "adam"
    steps: int = 3


def _clip_pair(case: ClipCase) -> dict[str, Any]:
    """DDP + torch's clip and the engine + its clip, side by side on the same batches."""
    rank = torch.distributed.get_rank()
    cls, kwargs = OPTIMIZERS[case.optimizer]
    reference, model = make_model(), make_model()
    ddp = DDP(reference)
    plain = cls(reference.parameters(), **kwargs)
    opt = cls(model.parameters(), **kwargs)
    engine = ShardedDataParallel(model, opt, partitioner=PARTITIONERS[case.partitioner](), bucket_cap_mb=0.001)
    norms: dict[str, list[float]] = {"ddp": [], "engine": []}
    for step in range(case.steps):
        for name, wrapped, optimizer in (("ddp", ddp, plain), ("engine", engine, opt)):
            optimizer.zero_grad()
            accumulated_backward(wrapped, step, rank, case.accumulate)
            if name == "ddp":
                norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), case.max_norm, case.norm_type)
            else:
                norm = engine.clip_grad_norm_(case.max_norm, case.norm_type)
            norms[name].append(norm.item())
            optimizer.step()
    engine.close()
    return {"diff": max_diff(reference.parameters(), model.parameters()), "norms": norms}


CLIP_CASES = [
    ClipCase("sorted_greedy"),
    ClipCase("sorted_greedy", norm_type=float("inf"), max_norm=0.01),
    ClipCase("sorted_greedy", accumulate=2, optimizer="sgd"),
    ClipCase("sorted_greedy", max_norm=1e3),  # never clips
    ClipCase("flat"),
    ClipCase("flat", norm_type=float("inf"), max_norm=0.01),
    ClipCase("flat", accumulate=2, optimizer="sgd"),
]


def _clip_cases(cases: list[ClipCase]) -> list[dict[str, Any]]:
    return [_clip_pair(case) for case in cases]


def test_clip_grad_norm_matches_ddp_and_torch_clip(world):
    for rank_results in world(_clip_cases, 2, CLIP_CASES):
        for case, result in zip(CLIP_CASES, rank_results):
            ddp, engine = result["norms"]["ddp"], result["norms"]["engine"]
            if case.max_norm < 1:
                assert min(ddp) > case.max_norm, (case, ddp)  # the case does clip
            if case.partitioner == "sorted_greedy" or case.norm_type == float("inf"):
                assert engine == ddp and result["diff"] == 0.0, (case, result)
            else:
                assert max(abs(a - b) / b for a, b in zip(engine, ddp)) <= 1e-6, (case, result)
                assert result["diff"] <= 1e-6, (case, result)


# ---------------------------------------------------------------------------- checkpoints
def _engine_of(
    partitioner: str, seed: int = 0, shard_size: int | None = None
) -> tuple[ShardedDataParallel, torch.optim.Optimizer]:
    model = make_model(seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine = ShardedDataParallel(
        model, opt, partitioner=PARTITIONERS[partitioner](), bucket_cap_mb=0.001, shard_size=shard_size
    )
    return engine, opt


def _steps(wrapped: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        accumulated_backward(wrapped, step, torch.distributed.get_rank())
        opt.step()


def _same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two torch.optim state dicts hold the same state (bitwise) and hyper-parameters."""
    if sorted(a["state"]) != sorted(b["state"]) or [g["params"] for g in a["param_groups"]] != [
        g["params"] for g in b["param_groups"]
    ]:
        return False
    return all(
        sorted(a["state"][k]) == sorted(b["state"][k])
        and all(torch.equal(a["state"][k][n], b["state"][k][n]) for n in a["state"][k])
        for k in a["state"]
    )


def _save_both(engine: ShardedDataParallel, opt: torch.optim.Optimizer, directory: Path, **extra: Any) -> None:
    """A native checkpoint at ``directory/native`` and a DCP one at ``directory/dcp``."""
    checkpoint.save_checkpoint(directory / "native", engine.states(), engine.module, extra=extra)
    osd = zero_lab.dcp.get_optimizer_state_dict(engine.module, opt)
    zero_lab.dcp.save({"model": engine.module.state_dict(), "optim": osd}, directory / "dcp")


def _load(engine: ShardedDataParallel, opt: torch.optim.Optimizer, directory: Path, form: str) -> dict[str, Any]:
    """Load ``directory/<form>`` (native or DCP, as :func:`_save_both` wrote) into a fresh engine; the
    native manifest's ``extra`` (DCP: empty)."""
    if form == "native":
        return checkpoint.load_checkpoint(directory / "native", engine.states(), engine.module)
    template = {"model": engine.module.state_dict(), "optim": zero_lab.dcp.get_optimizer_state_dict(engine.module, opt)}
    zero_lab.dcp.load(template, directory / "dcp")
    zero_lab.dcp.set_optimizer_state_dict(engine.module, opt, template["optim"])
    return {}


def _round_trips(directory: str) -> list[dict[str, Any]]:
    """Per partitioner: 2 steps, the consolidated state against DDP + Adam's, a native and a DCP save,
    2 more steps; fresh engines loaded from each save run the same 2 steps."""
    rank = torch.distributed.get_rank()
    results = []
    for partitioner in ("flat", "sorted_greedy"):
        reference = make_model()
        plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
        ddp = DDP(reference)
        engine, opt = _engine_of(partitioner)
        _steps(ddp, plain, range(2))
        _steps(engine, opt, range(2))
        full = engine.states().full_state_dict(to=0)
        consolidated = _same_state(full, plain.state_dict()) if rank == 0 else full is None
        saved = Path(directory) / partitioner
        _save_both(engine, opt, saved, step=2)
        _steps(engine, opt, range(2, 4))
        engine.close()
        loaded = {}
        for form in ("native", "dcp"):
            again, opt2 = _engine_of(partitioner, seed=5)  # other weights: the load must replace them
            assert _load(again, opt2, saved, form) == ({"step": 2} if form == "native" else {})
            _steps(again, opt2, range(2, 4))
            again.close()
            loaded[form] = max_diff(engine.module.parameters(), again.module.parameters())
        results.append({"consolidated": consolidated, **loaded})
    return results


@pytest.fixture(scope="module")
def saved(world, tmp_path_factory) -> tuple[str, list[Any]]:
    """The 2-rank round trips, run once: their checkpoints' directory and the results."""
    directory = str(tmp_path_factory.mktemp("engine_checkpoints"))
    return directory, world(_round_trips, 2, directory)


def test_native_and_dcp_checkpoints_round_trip_bitwise(saved):
    for rank_results in saved[1]:
        for result in rank_results:
            assert result == {"consolidated": True, "native": 0.0, "dcp": 0.0}, result


def _resharded(directory: str) -> dict[str, Any]:
    """A 2-rank Flat checkpoint loaded at 3 ranks: the engine's state is the exported plain state, and it
    trains on as DDP + Adam loaded from that plain state."""
    rank = torch.distributed.get_rank()
    saved = Path(directory) / "flat" / "native"
    engine, opt = _engine_of("sorted_greedy", seed=5)
    checkpoint.load_checkpoint(saved, engine.states(), engine.module)
    full = engine.states().full_state_dict(to=0)
    plain_state = checkpoint.load_file(checkpoint.export_plain_state_dict(saved, Path(directory) / f"plain-{rank}.pt"))
    loaded = _same_state(full, plain_state) if rank == 0 else full is None  # before training mutates plain_state
    reference = make_model(seed=7)
    reference.load_state_dict(engine.module.state_dict())
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    plain.load_state_dict(plain_state)
    _steps(DDP(reference), plain, range(2, 4))
    _steps(engine, opt, range(2, 4))
    engine.close()
    return {
        "loaded": loaded,
        "diff": max_diff(reference.parameters(), engine.module.parameters()),
    }


def test_native_checkpoint_reshards_to_three_ranks(world, saved):
    for result in world(_resharded, 3, saved[0]):
        assert result["loaded"] and result["diff"] <= 1e-6, result


# ---------------------------------------------------------------------------- precision
@dataclass(frozen=True)
class PrecisionCase:
    bf16_params: bool = False  # bf16 parameters: the engine steps fp32 main copies
    partitioner: str = "flat"
    accumulate: int = 1
    steps: int = 3


class _MainCopies:
    """The reference for bf16 parameters: Adam on fp32 copies of every parameter, fed the DDP-reduced bf16
    gradients cast to fp32, rounded back into the parameters after each step."""

    def __init__(self, model: torch.nn.Module):
        self.params = list(model.parameters())
        self.main = [p.detach().float() for p in self.params]
        self.adam = torch.optim.Adam(self.main, lr=1e-2)

    def zero_grad(self) -> None:
        self.adam.zero_grad()
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        for main, p in zip(self.main, self.params):
            main.grad = p.grad.float()
        self.adam.step()
        with torch.no_grad():
            for main, p in zip(self.main, self.params):
                p.copy_(main)


def _precision_pair(case: PrecisionCase) -> dict[str, Any]:
    """DDP and the engine, forward under ``torch.autocast("cpu", torch.bfloat16)``, on the same batches."""
    rank = torch.distributed.get_rank()
    reference, model = make_model(), make_model()
    if case.bf16_params:
        reference, model = reference.to(torch.bfloat16), model.to(torch.bfloat16)
    ddp = DDP(reference)
    plain: Any = _MainCopies(reference) if case.bf16_params else torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine = ShardedDataParallel(model, opt, partitioner=PARTITIONERS[case.partitioner](), bucket_cap_mb=0.001)
    losses: dict[str, list[float]] = {"ddp": [], "engine": []}
    for step in range(case.steps):
        for name, wrapped, optimizer in (("ddp", ddp, plain), ("engine", engine, opt)):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = accumulated_backward(wrapped, step, rank, case.accumulate)
            losses[name].append(loss.item())
            optimizer.step()
    engine.close()
    return {
        "diff": max_diff(reference.parameters(), model.parameters()),
        "losses_equal": losses["ddp"] == losses["engine"],
        "state_dtypes": sorted({str(v.dtype) for s in opt.state.values() for v in s.values() if v.dim()}),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "peak": engine.peak_grad_bytes,
        "bound": engine.grad_hold_bound(),
    }


PRECISION_CASES = [
    PrecisionCase(),
    PrecisionCase(partitioner="sorted_greedy", accumulate=2),
    PrecisionCase(bf16_params=True),
    PrecisionCase(bf16_params=True, partitioner="sorted_greedy", accumulate=2),
]


def _precision_cases(cases: list[PrecisionCase]) -> list[dict[str, Any]]:
    return [_precision_pair(case) for case in cases]


def test_autocast_and_bf16_parameters_train_as_ddp_bitwise(world):
    for rank_results in world(_precision_cases, 2, PRECISION_CASES):
        for case, result in zip(PRECISION_CASES, rank_results):
            assert result["diff"] == 0.0 and result["losses_equal"], (case, result)
            assert result["state_dtypes"] == ["torch.float32"], (case, result)  # bf16: Adam's state on the fp32 copies
            assert result["param_dtypes"] == (["torch.bfloat16"] if case.bf16_params else ["torch.float32"])
            assert 0 < result["peak"] <= result["bound"], (case, result)


def _grouped_round_trip(directory: str) -> dict[str, Any]:
    """Shard groups of 2 at W=4: group 0 writes the native checkpoint (the other group holds replicas);
    fresh engines loaded from it and from a DCP save train on bitwise as the uninterrupted run."""
    engine, opt = _engine_of("flat", shard_size=2)
    _steps(engine, opt, range(2))
    saved = Path(directory) / "grouped"
    _save_both(engine, opt, saved)
    _steps(engine, opt, range(2, 4))
    engine.close()
    diffs = {}
    for form in ("native", "dcp"):
        again, opt2 = _engine_of("flat", seed=5, shard_size=2)
        _load(again, opt2, saved, form)
        _steps(again, opt2, range(2, 4))
        again.close()
        diffs[form] = max_diff(engine.module.parameters(), again.module.parameters())
    manifest = checkpoint.read_manifest(saved / "native")
    return {
        **diffs,
        "world_size": manifest["world_size"],
        "files": sorted(n for n in manifest["files"] if n.startswith("optim")),
    }


def test_checkpoints_with_shard_groups_round_trip_bitwise(world, tmp_path):
    for result in world(_grouped_round_trip, 4, str(tmp_path)):
        assert result == {
            "native": 0.0,
            "dcp": 0.0,
            "world_size": 2,
            "files": ["optim-rank00000.pt", "optim-rank00001.pt"],
        }, result


# ---------------------------------------------------------------------------- Muon + AdamW
def _muon_optimizer(model: torch.nn.Module) -> ChainedOptimizer:
    groups = muon_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 1e-2}, named=False)
    return ChainedOptimizer(groups, torch.optim.AdamW, weight_decay=0.1)


def _muon_engine(seed: int = 0, **kwargs: Any) -> tuple[ShardedDataParallel, ChainedOptimizer]:
    model = make_model(seed=seed)
    opt = _muon_optimizer(model)
    return ShardedDataParallel(model, opt, bucket_cap_mb=0.001, **kwargs), opt


def _muon_program(directory: str) -> dict[str, Any]:
    """Muon on the hidden matrices (whole, each on its owner) + AdamW on the rest: the engine (sorted-greedy
    by default) against DDP + the same ChainedOptimizer, with accumulation and clipping; then a native and
    a DCP round trip of Muon's momentum."""
    rank = torch.distributed.get_rank()
    reference = make_model()
    ddp, plain = DDP(reference), _muon_optimizer(reference)
    engine, opt = _muon_engine()
    for step in range(4):
        for wrapped, optimizer in ((ddp, plain), (engine, opt)):
            optimizer.zero_grad()
            accumulated_backward(wrapped, step, rank, accumulate=1 + step % 2)
            if step == 3:
                clip = torch.nn.utils.clip_grad_norm_ if wrapped is ddp else None
                norm = clip(reference.parameters(), 0.05) if clip else engine.clip_grad_norm_(0.05)
                assert norm > 0.05
            optimizer.step()
        if step == 1:
            _save_both(engine, opt, Path(directory) / "muon")
    engine.close()
    resumed = {}
    for form in ("native", "dcp"):
        again, opt2 = _muon_engine(seed=5)
        _load(again, opt2, Path(directory) / "muon", form)
        for step in range(2, 4):
            opt2.zero_grad()
            accumulated_backward(again, step, rank, accumulate=1 + step % 2)
            if step == 3:
                again.clip_grad_norm_(0.05)
            opt2.step()
        again.close()
        resumed[form] = max_diff(engine.module.parameters(), again.module.parameters())
    stepped_whole = [
        t for g, cls in zip(opt.param_groups, opt.group_classes()) if cls is torch.optim.Muon for t in g["params"]
    ]
    return {
        "diff": max_diff(reference.parameters(), engine.module.parameters()),
        "resumed": resumed,
        "muon_shapes": sorted(tuple(t.shape) for t in stepped_whole),
        "partitioner": repr(engine.partitioner),
    }


def test_muon_and_adamw_train_as_ddp_bitwise_and_round_trip(world, tmp_path):
    results = world(_muon_program, 2, str(tmp_path))
    for result in results:
        assert result["diff"] == 0.0 and result["resumed"] == {"native": 0.0, "dcp": 0.0}, result
        assert result["partitioner"].startswith("SortedGreedy")
    # each hidden matrix (24x12, 24x24, 6x24, 3x6) stepped whole by exactly one rank
    assert sorted(results[0]["muon_shapes"] + results[1]["muon_shapes"]) == [(3, 6), (6, 24), (24, 12), (24, 24)]


def _bf16_round_trip(directory: str) -> dict[str, Any]:
    """bf16 parameters: the native checkpoint keeps the fp32 main copies (ZeRO's master key), so a fresh
    engine loaded from it trains on bitwise as the uninterrupted run (without them it would not)."""
    rank = torch.distributed.get_rank()

    def build(seed: int) -> tuple[ShardedDataParallel, torch.optim.Optimizer]:
        model = make_model(seed=seed).to(torch.bfloat16)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return ShardedDataParallel(model, opt, bucket_cap_mb=0.001), opt

    def steps(engine: ShardedDataParallel, opt: torch.optim.Optimizer, span: range) -> None:
        for step in span:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                accumulated_backward(engine, step, rank)
            opt.step()

    engine, opt = build(0)
    steps(engine, opt, range(2))
    checkpoint.save_checkpoint(Path(directory) / "bf16", engine.states(), engine.module)
    steps(engine, opt, range(2, 4))
    engine.close()
    again, opt2 = build(5)
    checkpoint.load_checkpoint(Path(directory) / "bf16", again.states(), again.module)
    steps(again, opt2, range(2, 4))
    again.close()
    return {"diff": max_diff(engine.module.parameters(), again.module.parameters())}


def test_bf16_native_checkpoint_keeps_the_main_copies(world, tmp_path):
    for result in world(_bf16_round_trip, 2, str(tmp_path)):
        assert result["diff"] == 0.0, result
