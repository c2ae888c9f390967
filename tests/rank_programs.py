"""Programs that run on every rank of a test world (importable, so a forkserver can preload them).

Each returns plain data (floats, lists, small tensors) that the test asserts on.
Reference runs live in the same world: a DDP model + the plain optimizer trained on the
same data, so parity is checked without a second world.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from zero_lab import ZeroRedundancyOptimizer
from zero_lab.measure import optimizer_state_bytes
from zero_lab.partition import Partitioner

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adam": (torch.optim.Adam, {"lr": 1e-2}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    "sgd": (torch.optim.SGD, {"lr": 5e-2, "momentum": 0.9}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 1e-3}),
    "adagrad": (torch.optim.Adagrad, {"lr": 1e-2}),
}


def make_model(seed: int = 0) -> nn.Module:
    """A small MLP with parameters of varied sizes (so partitions are uneven)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 6), nn.Tanh(), nn.Linear(6, 3)
    )


def batch(step: int, rank: int, n: int = 8) -> torch.Tensor:
    """This rank's inputs at ``step`` (different per rank and step, same on every run)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 12, generator=g)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def max_diff(a: Any, b: Any) -> float:
    """Largest absolute elementwise difference between two sequences of tensors."""
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def zero_or_plain(mode: str, params: Any, cls: type = torch.optim.Adam, **kwargs: Any) -> torch.optim.Optimizer:
    """``ZeroRedundancyOptimizer(params, cls, **kwargs)`` for mode "zero", else ``cls(params, ...)``
    (``partitioner`` only goes to ZeRO)."""
    if mode == "zero":
        return ZeroRedundancyOptimizer(params, cls, **kwargs)
    kwargs.pop("partitioner", None)
    return cls(params, **kwargs)


def param_groups(model: nn.Module, layout: str) -> Any:
    if layout == "tensors":
        return list(model.parameters())
    if layout == "named":
        return list(model.named_parameters())
    # two groups: no weight decay and a lower lr on biases
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 3e-3}]


@dataclass
class Case:
    """One parity scenario: ZeRO vs DDP + the plain optimizer on identical data."""

    optimizer: str = "adam"
    bucket_view: bool = False
    partitioner: Partitioner | None = None
    layout: str = "tensors"  # tensors | named | groups
    steps: int = 10
    frozen: tuple[int, ...] = ()  # parameter indices frozen from the start
    unfreeze_at: int | None = None  # step at which frozen parameters become trainable
    freeze_at: int | None = None  # step at which parameter 0 gets frozen
    closure: bool = False
    scheduler: bool = False
    clip: float | None = None  # clip the global gradient norm to this before each step
    norm_type: float = 2.0
    extra: dict[str, Any] = field(default_factory=dict)


def _build(case: Case, zero: bool) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = make_model()
    for index, param in enumerate(model.parameters()):
        param.requires_grad_(index not in case.frozen)
    ddp = DDP(model)
    cls, kwargs = OPTIMIZERS[case.optimizer]
    params = param_groups(model, case.layout)
    if zero:
        opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            params, cls, parameters_as_bucket_view=case.bucket_view, partitioner=case.partitioner, **kwargs
        )
    else:
        opt = cls(params, **kwargs)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if case.scheduler else None
    return ddp, opt, sched


def _train(case: Case, zero: bool) -> tuple[nn.Module, list[float], Any]:
    ddp, opt, sched = _build(case, zero)
    model = ddp.module
    losses: list[float] = []
    norms: list[float] = []
    for step in range(case.steps):
        if step == case.unfreeze_at:
            for p in model.parameters():
                p.requires_grad_(True)
            ddp, model = _rewrap(ddp)
        if step == case.freeze_at:
            next(model.parameters()).requires_grad_(False)
            ddp, model = _rewrap(ddp)
        x = batch(step, dist.get_rank())

        def closure(ddp: nn.Module = ddp, x: torch.Tensor = x) -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(ddp, x)
            loss.backward()
            return loss

        if case.closure:
            loss = opt.step(closure)
        else:
            loss = closure()
            if case.clip is not None:
                norms.append(float(_clip(opt, model, case.clip, case.norm_type)))
            opt.step()
        losses.append(float(loss))
        if sched is not None:
            sched.step()
    opt.grad_norms = norms  # type: ignore[attr-defined]
    return model, losses, opt


def _clip(opt: torch.optim.Optimizer, model: nn.Module, max_norm: float, norm_type: float) -> torch.Tensor:
    if isinstance(opt, ZeroRedundancyOptimizer):
        return opt.clip_grad_norm_(max_norm, norm_type)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)


def _rewrap(ddp: DDP) -> tuple[DDP, nn.Module]:
    """DDP fixes its trainable set at construction; rebuild it after a change."""
    model = ddp.module
    return DDP(model), model


def parity(cases: list[Case]) -> list[dict[str, Any]]:
    """For each case: max |ZeRO - reference| over parameters, losses, state bytes."""
    out = []
    for case in cases:
        zero_model, zero_losses, zero_opt = _train(case, zero=True)
        ref_model, ref_losses, ref_opt = _train(case, zero=False)
        diff = max_diff(zero_model.parameters(), ref_model.parameters())
        out.append(
            {
                "max_diff": diff,
                "zero_losses": zero_losses,
                "ref_losses": ref_losses,
                "state_bytes": optimizer_state_bytes(zero_opt),
                "ref_state_bytes": optimizer_state_bytes(ref_opt),
                "largest_param_state_bytes": 2 * max(p.numel() * p.element_size() for p in zero_model.parameters()),
                "checksum": float(sum(p.double().sum() for p in zero_model.parameters())),
                "zero_norms": zero_opt.grad_norms,
                "ref_norms": ref_opt.grad_norms,
            }
        )
    return out


def versus_torch(bucket_view: bool, steps: int = 8) -> dict[str, Any]:
    """zero_lab against torch.distributed.optim.ZeroRedundancyOptimizer: owners and parameters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    results = {}
    models = {}
    for name, cls in (("zero_lab", ZeroRedundancyOptimizer), ("torch", TorchZero)):
        model = make_model()
        ddp = DDP(model)
        opt = cls(param_groups(model, "groups"), torch.optim.Adam, parameters_as_bucket_view=bucket_view, lr=1e-2)
        for step in range(steps):
            opt.zero_grad()
            loss_of(ddp, batch(step, dist.get_rank())).backward()
            opt.step()
        models[name] = model
        results[name] = opt
    params = list(models["zero_lab"].parameters())
    torch_owner = results["torch"]._param_to_rank
    torch_order = [p for group in results["torch"].param_groups for p in group["params"]]
    return {
        "owners_equal": results["zero_lab"].partition.owners() == [torch_owner[p] for p in torch_order],
        "max_diff": max_diff(params, models["torch"].parameters()),
    }


def checkpoint_round_trip(partitioner: Partitioner | None = None, steps: int = 6) -> dict[str, Any]:
    """Train, consolidate, save; load into fresh ZeRO and into plain Adam (and back); continue.

    Returns the max parameter difference of each continued run against the
    uninterrupted ZeRO run, and whether rank 0's consolidated state loads into Adam.
    """
    rank = dist.get_rank()

    def fresh(zero: bool, model: nn.Module) -> torch.optim.Optimizer:
        if zero:
            return ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
        return torch.optim.Adam(model.parameters(), lr=1e-2)

    def run(ddp: DDP, opt: torch.optim.Optimizer, first: int, last: int) -> None:
        for step in range(first, last):
            opt.zero_grad()
            loss_of(ddp, batch(step, rank)).backward()
            opt.step()

    model = make_model()
    ddp = DDP(model)
    opt = fresh(True, model)
    run(ddp, opt, 0, steps)
    opt.consolidate_state_dict(to=0)
    blob = io.BytesIO()
    if rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, blob)
    payload = [blob.getvalue()]
    dist.broadcast_object_list(payload, src=0)
    run(ddp, opt, steps, 2 * steps)
    target = [p.detach().clone() for p in model.parameters()]

    diffs = {}
    # zero: a fresh ZeRO loads the consolidated state; plain: a plain Adam on every rank loads it;
    # plain_then_zero: the plain Adam's own state_dict() goes back into a fresh ZeRO.
    for mode in ("zero", "plain", "plain_then_zero"):
        # Fresh from bytes each time: load_state_dict aliases the given tensors (as torch's does).
        saved = torch.load(io.BytesIO(payload[0]), weights_only=True)
        model2 = make_model(seed=123)
        model2.load_state_dict(saved["model"])
        ddp2 = DDP(model2)
        opt2 = fresh(mode == "zero", model2)
        opt2.load_state_dict(saved["optim"])
        if mode == "plain_then_zero":
            plain_state = opt2.state_dict()
            opt2 = fresh(True, model2)
            opt2.load_state_dict(plain_state)
        run(ddp2, opt2, steps, 2 * steps)
        diffs[mode] = max_diff(model2.parameters(), target)
    return {"diffs": diffs, "state_keys": sorted(saved["optim"]["state"].keys())}


def uneven_join(steps_per_rank: list[int]) -> dict[str, Any]:
    """Uneven inputs under Join: ZeRO+DDP against DDP+Adam on the ranks still training."""
    rank = dist.get_rank()
    models = {}
    for mode in ("zero", "plain"):
        model = make_model()
        ddp = DDP(model)
        opt = zero_or_plain(mode, model.parameters(), lr=1e-2)
        with Join([ddp, opt] if mode == "zero" else [ddp]):
            for step in range(steps_per_rank[rank]):
                opt.zero_grad()
                loss_of(ddp, batch(step, rank)).backward()
                opt.step()
        models[mode] = model
    # Gather the plain run's parameters from the rank that trained longest: that is DDP's answer.
    longest = max(range(len(steps_per_rank)), key=lambda r: steps_per_rank[r])
    reference = [p.detach().clone() for p in models["plain"].parameters()]
    for tensor in reference:
        dist.broadcast(tensor, src=longest)
    return {"max_diff": max_diff(models["zero"].parameters(), reference)}


def add_group_mid_run(steps: int = 8, add_at: int = 3) -> dict[str, Any]:
    """Start with weights only, add the biases as a new group at ``add_at``; compare to plain Adam."""
    rank = dist.get_rank()
    models, owners_before, owners_after = {}, None, None
    for mode in ("zero", "plain"):
        model = make_model()
        ddp = DDP(model)
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
        opt = zero_or_plain(mode, weights, lr=1e-2)
        if mode == "zero":
            owners_before = opt.partition.owners()
        for step in range(steps):
            if step == add_at:
                opt.add_param_group({"params": biases, "lr": 3e-3})
            opt.zero_grad()
            loss_of(ddp, batch(step, rank)).backward()
            opt.step()
        if mode == "zero":
            owners_after = opt.partition.owners()
            local_groups = len(opt.optim.param_groups)
        models[mode] = model
    return {
        "max_diff": max_diff(models["zero"].parameters(), models["plain"].parameters()),
        "owners_before": owners_before,
        "owners_after": owners_after,
        "local_groups": local_groups,
    }


def local_group_shapes() -> list[int]:
    """Sizes of this rank's local groups when one global group is a single tiny tensor."""
    big = [torch.nn.Parameter(torch.randn(64)) for _ in range(3)]
    tiny = torch.nn.Parameter(torch.randn(1))
    opt = ZeroRedundancyOptimizer([{"params": big}, {"params": [tiny]}], torch.optim.Adam, lr=1e-3)
    return [len(group["params"]) for group in opt.optim.param_groups]


def exchange_bytes(partitioner: Partitioner | None, bucket_view: bool, exchange: str = "auto") -> dict[str, Any]:
    """Bytes and calls of one step's exchange, against the model's trainable bytes."""
    model = make_model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(
        model.parameters(),
        torch.optim.Adam,
        parameters_as_bucket_view=bucket_view,
        partitioner=partitioner,
        exchange=exchange,
        lr=1e-3,
    )
    loss_of(ddp, batch(0, dist.get_rank())).backward()
    before = opt.comm_stats.snapshot()
    opt.step()
    used = opt.comm_stats.since(before)
    return {
        "bytes": used.bytes,
        "calls": used.calls,
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "num_params": len(list(model.parameters())),
        "mode": opt.exchange_mode,
        "rank_bytes": list(opt.partition.report().bytes_per_rank),
    }


@dataclass
class OverlapCase:
    """Overlap run vs the same ZeRO run without overlap and vs DDP + the plain optimizer."""

    optimizer: str = "adam"
    interleaved: bool = False
    shard_buckets: bool = False
    layout: str = "tensors"
    steps: int = 6
    static_graph: bool = False
    accumulate: int = 1  # micro-batches per step (the first ones under no_sync)
    unused: bool = False  # a parameter no rank uses (find_unused_parameters=True)
    bucket_cap_mb: float = 0.002  # tiny buckets so the small model spans several
    partitioner: Partitioner | None = None


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = make_model()
        self.spare = nn.Linear(3, 3)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _overlap_train(case: OverlapCase, mode: str) -> tuple[nn.Module, list[float]]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = WithUnused() if case.unused else make_model()
    ddp = DDP(
        model,
        bucket_cap_mb=case.bucket_cap_mb,
        static_graph=case.static_graph,
        find_unused_parameters=case.unused,
    )
    cls, kwargs = OPTIMIZERS[case.optimizer]
    params = param_groups(model, case.layout)
    if mode == "plain":
        opt: torch.optim.Optimizer = cls(params, **kwargs)
    else:
        overlap = mode == "overlap"
        opt = ZeroRedundancyOptimizer(params, cls, overlap_with_ddp=overlap, partitioner=case.partitioner, **kwargs)
        if overlap:
            wrap = hook_with_zero_step_interleaved if case.interleaved else hook_with_zero_step
            ddp.register_comm_hook(None, wrap(allreduce_hook, ddp, opt, shard_buckets=case.shard_buckets))
    losses = []
    for step in range(case.steps):
        opt.zero_grad()
        total = 0.0
        for micro in range(case.accumulate):
            x = batch(step * case.accumulate + micro, rank)
            if micro < case.accumulate - 1:
                with ddp.no_sync():
                    loss = loss_of(ddp, x) / case.accumulate
                    loss.backward()
            else:
                loss = loss_of(ddp, x) / case.accumulate
                loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return model, losses


def overlap_parity(cases: list[OverlapCase]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        runs = {mode: _overlap_train(case, mode) for mode in ("overlap", "zero", "plain")}
        params = {mode: list(model.parameters()) for mode, (model, _) in runs.items()}

        def diff(a: str, b: str, params: dict[str, list[torch.Tensor]] = params) -> float:
            return max((x - y).abs().max().item() for x, y in zip(params[a], params[b]))

        out.append(
            {
                "vs_zero": diff("overlap", "zero"),
                "vs_plain": diff("overlap", "plain"),
                "losses": {mode: losses for mode, (_, losses) in runs.items()},
            }
        )
    return out


def overlap_trainability_change() -> str:
    """Changing requires_grad mid-run under overlap must raise a clear error, not hang."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from zero_lab.overlap import hook_with_zero_step

    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, lr=1e-2)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, opt))
    loss_of(ddp, batch(0, dist.get_rank())).backward()
    next(model.parameters()).requires_grad_(False)
    try:
        loss_of(ddp, batch(1, dist.get_rank())).backward()
    except RuntimeError as error:
        return str(error)
    return "no error"


class EmbeddingHeavy(nn.Module):
    """An LM-like model whose embedding is most of the parameters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(1000, 32)
        self.mix = nn.Linear(32, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens).mean(dim=1))))


def embedding_heavy(partitioner: Partitioner | None, steps: int = 10) -> dict[str, Any]:
    """Imbalance, per-rank state bytes and DDP parity on an embedding-heavy model."""
    rank = dist.get_rank()
    models = {}
    for mode in ("zero", "plain"):
        model = EmbeddingHeavy()
        ddp = DDP(model)
        opt = zero_or_plain(mode, model.parameters(), partitioner=partitioner, lr=1e-2)
        if mode == "zero":
            zero_opt = opt
        for step in range(steps):
            g = torch.Generator().manual_seed(1000 * step + rank)
            tokens = torch.randint(0, 1000, (8, 5), generator=g)
            opt.zero_grad()
            ddp(tokens).pow(2).mean().backward()
            opt.step()
        models[mode] = model
    return {
        "imbalance": zero_opt.partition.report().imbalance,
        "state_bytes": zero_opt.local_state_bytes(),
        "max_diff": max_diff(models["zero"].parameters(), models["plain"].parameters()),
    }


def mixed_precision(partitioner: Partitioner | None, steps: int = 30, lr: float = 1e-3) -> dict[str, Any]:
    """bf16 parameters with and without fp32 master shards, against an fp32 DDP + Adam run.

    Compares *updates* (final - initial parameters), relative to the fp32 run's largest
    update, so the rounding of the initial weights to bf16 does not count as drift.
    """
    rank = dist.get_rank()
    final, start, losses = {}, {}, {}
    extra = {}
    for mode in ("fp32", "bf16-master", "bf16"):
        model = make_model()
        if mode != "fp32":
            model = model.to(torch.bfloat16)
        ddp = DDP(model)
        start[mode] = [p.detach().float().clone() for p in model.parameters()]
        losses[mode] = []
        if mode == "fp32":
            opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            opt = ZeroRedundancyOptimizer(
                model.parameters(),
                torch.optim.Adam,
                partitioner=partitioner,
                master_weights=mode == "bf16-master",
                lr=lr,
            )
        for step in range(steps):
            x = batch(step, rank).to(next(model.parameters()).dtype)
            opt.zero_grad()
            loss = loss_of(ddp, x)
            loss.backward()
            opt.step()
            losses[mode].append(loss.item())
        final[mode] = [p.detach().float().clone() for p in model.parameters()]
        if mode == "bf16-master":
            extra = {
                "master_bytes": opt.master_weight_bytes(),
                "state_dtypes": sorted({str(v.dtype) for s in opt.optim.state.values() for v in s.values() if v.dim()}),
                "owned_numel": sum(s.numel for s in opt.partition.shards_of(rank)),
            }

    def update(mode: str) -> list[torch.Tensor]:
        return [a - b for a, b in zip(final[mode], start[mode])]

    reference = update("fp32")
    scale = max(u.abs().max().item() for u in reference)

    def drift(mode: str) -> float:
        return max_diff(update(mode), reference) / scale

    return {
        "drift_master": drift("bf16-master"),
        "drift_bf16": drift("bf16"),
        "losses": losses,
        **extra,
    }


# ---------------------------------------------------------------- checkpoints
GLOBAL_BATCH = 12  # divisible by every world size the tests use (1, 2, 3, 4)


def global_batch_slice(step: int) -> torch.Tensor:
    """This rank's rows of the step's global batch: the trajectory is the same at any world size."""
    g = torch.Generator().manual_seed(7000 + step)
    x = torch.randn(GLOBAL_BATCH, 12, generator=g)
    return x[dist.get_rank() :: dist.get_world_size()]


def _global_loss(ddp: nn.Module, step: int) -> torch.Tensor:
    loss = loss_of(ddp, global_batch_slice(step))
    loss.backward()
    reported = loss.detach().clone()
    dist.all_reduce(reported)
    return reported / dist.get_world_size()


def _train_steps(ddp: nn.Module, opt: torch.optim.Optimizer, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last):
        opt.zero_grad()
        losses.append(_global_loss(ddp, step).item())
        opt.step()
    return losses


def train_and_save(directory: str, partitioner: Partitioner | None, save_at: int, total: int) -> list[float]:
    """Train ``total`` steps, saving a sharded checkpoint after ``save_at``; every step's loss."""
    from zero_lab.checkpoint import save_checkpoint

    model = make_model()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
    losses = _train_steps(ddp, opt, 0, save_at)
    save_checkpoint(directory, opt, model, extra={"step": save_at})
    return losses + _train_steps(ddp, opt, save_at, total)


def resume_and_train(directory: str, partitioner: Partitioner | None, total: int) -> list[float]:
    """Load a checkpoint saved at any world size / partitioner and train to ``total``."""
    from zero_lab.checkpoint import load_checkpoint

    model = make_model(seed=99)  # different init: everything must come from the checkpoint
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, partitioner=partitioner, lr=1e-2)
    extra = load_checkpoint(directory, opt, model)
    ddp = DDP(model)
    return _train_steps(ddp, opt, extra["step"], total)


def plain_from_export(model_file: str, optim_file: str, first: int, total: int) -> list[float]:
    """DDP + plain Adam from the exported plain state: the reference for a resharded resume."""
    model = make_model(seed=99)
    model.load_state_dict(torch.load(model_file, weights_only=True))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt.load_state_dict(torch.load(optim_file, weights_only=True))
    return _train_steps(DDP(model), opt, first, total)


def load_expecting_error(directory: str) -> str:
    from zero_lab.checkpoint import CheckpointError, load_checkpoint

    model = make_model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    try:
        load_checkpoint(directory, opt, model)
    except CheckpointError as error:
        return str(error)
    return "no error"


def raise_on_rank(bad_rank: int, pid_dir: str) -> str:
    """Rank ``bad_rank`` raises while the others wait in a collective; each rank leaves its pid."""
    import os

    with open(f"{pid_dir}/rank{dist.get_rank()}.pid", "w") as handle:
        handle.write(str(os.getpid()))
    dist.barrier()
    if dist.get_rank() == bad_rank:
        raise ValueError(f"injected failure on rank {bad_rank}")
    dist.barrier()  # blocks until the launcher kills this rank
    return "unreachable"


def wait_for_stop(ignore_sigterm: bool, pid_dir: str, seconds: float = 60.0) -> str:
    """Write this rank's pid, then sleep: a rank that dies of SIGTERM, or ignores it."""
    import os
    import signal
    import time
    from pathlib import Path

    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(pid_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)
    return "slept"
