"""The exchange: every collective, layout and prefetch setting gives bitwise the same training.

One world per world size runs every configuration on a model with a tied embedding/head,
a module called twice and a module called out of registration order, and compares
checksums of the parameters, of an eval forward taken between steps (while a prefetched
exchange may be in flight) and of the consolidated optimizer state. With prefetch, every
rank issues the units in rank 0's first-use order (rank 1 is fed a different one), and a
single-unit exchange is warned about. A collective registered by the test (a zero-padded
all-reduce, one class) trains every layout to the same bits as the broadcasts;
``exchange="auto"`` does not time it (it stages a copy in the per-shard layout: auto times only
the collectives that fill a unit in place). A transposed (non-contiguous) weight reaches every
replica with every collective.
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.training import TiedLM
from tests.padded_all_reduce import PaddedAllReduce
from tests.registries import assert_auto_rule
from zero_lab import Flat, ZeroRedundancyOptimizer
from zero_lab.collectives import COLLECTIVES, register_collective
from zero_lab.overlap import hook_with_zero_step_interleaved, prefetch_exchange

#: What exchange="auto" chooses among, in its preference order (the in-place collectives).
AUTO = ("broadcast", "p2p_all_gather")

#: TiedLM's parameters take 288, 512 and 288 bytes by module: a 300-byte cap gives three buffers
CAPPED = Flat(bucket_cap_mb=300 / 2**20)
LAYOUTS = {
    "per_shard": (None, False),
    "bucket": (None, True),
    "flat": (Flat(), False),
    "flat_view": (Flat(), True),
    "flat_capped": (CAPPED, True),
}
#: model.parameters(): late.weight 0, late.bias 1, embed.weight 2 (= head.weight), shared.* 3, 4;
#: the forward reads embed, shared, late, then head (embed's weight again)
FIRST_USE = {2: 0, 3: 1, 4: 2, 0: 3, 1: 4}
STEPS = 4


def _tokens(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(100 * step + rank))


def _digest(tensors: Any) -> str:
    sha = hashlib.sha256()
    for t in tensors:
        sha.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()[:16]


def _train(layout: str, exchange: str, prefetch: bool, overlap: bool = False) -> dict:
    model = TiedLM()
    ddp = DDP(model)
    partitioner, bucket_view = LAYOUTS[layout]
    opt = ZeroRedundancyOptimizer(
        model.parameters(),
        torch.optim.Adam,
        partitioner=partitioner,
        parameters_as_bucket_view=bucket_view,
        overlap_with_ddp=overlap,
        exchange=exchange,
        lr=1e-2,
    )
    if overlap:
        ddp.register_comm_hook(None, hook_with_zero_step_interleaved(allreduce_hook, ddp, opt))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = prefetch_exchange(model, opt) if prefetch else None
    units = opt.pipeline.exchange_units  # with auto undecided: the most any candidate collective would issue
    if prefetch and dist.get_rank() == 1:
        opt.pipeline.note_first_use([0, 1])  # a different order on rank 1: rank 0's must win
    evals = []
    for step in range(STEPS):
        opt.zero_grad()
        idx = _tokens(step, dist.get_rank())
        nn.functional.cross_entropy(ddp(idx).flatten(0, 1), idx.flatten()).backward()
        if not overlap:
            opt.clip_grad_norm_(1.0)
        opt.step()
        model.eval()
        with torch.no_grad():  # reads parameters while a prefetched exchange may be in flight
            evals.append(model(_tokens(99, 0)))
        model.train()
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if dist.get_rank() == 0 else {"state": {}}
    if handle is not None:
        handle.remove()
    return {
        "params": _digest(model.parameters()),
        "evals": _digest(evals),
        "state": _digest(v for s in state["state"].values() for k, v in sorted(s.items()) if torch.is_tensor(v)),
        "report": opt.exchange_report().as_dict(),
        "units": units,
        "single_buffer_warning": any("single buffer" in str(w.message) for w in caught),
        "first_use": opt.pipeline.first_use.position,
    }


def every_mode() -> dict[str, Any]:
    """Rank program: every layout x collective x prefetch, plus overlap(+prefetch)."""
    runs = {
        (layout, exchange, prefetch): _train(layout, exchange, prefetch)
        for layout, exchange, prefetch in itertools.product(LAYOUTS, (*COLLECTIVES, "auto"), (False, True))
    }
    out: dict[str, Any] = {f"{a}/{b}/{c}": run for (a, b, c), run in runs.items()}
    out["overlap"] = _train("per_shard", "broadcast", False, overlap=True)
    out["overlap_prefetch"] = _train("per_shard", "broadcast", True, overlap=True)
    register_collective(PaddedAllReduce)  # in this rank's process only; after the runs above
    out |= {f"{layout}/all_reduce/False": _train(layout, "all_reduce", False) for layout in LAYOUTS}
    out["auto_with_all_reduce"] = _train("per_shard", "auto", False)
    out["transposed"] = {name: _transposed(name) for name in (*COLLECTIVES, "all_reduce")}
    return out


def _transposed(exchange: str) -> str:
    """One step of a layer whose weight is a transposed (non-contiguous) tensor, each rank on its own batch."""
    torch.manual_seed(0)
    layer = nn.Linear(3, 4)
    with torch.no_grad():
        layer.weight = nn.Parameter(torch.arange(12.0).view(3, 4).t() / 10)
    opt = ZeroRedundancyOptimizer(layer.parameters(), torch.optim.SGD, exchange=exchange, lr=0.1)
    layer(torch.randn(2, 3, generator=torch.Generator().manual_seed(dist.get_rank()))).sum().backward()
    opt.step()  # the owner's update must reach the parameter itself on every rank
    return _digest(p.contiguous() for p in layer.parameters())


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_exchange_mode_trains_bitwise_the_same(world, world_size):
    results = world(every_mode, world_size)
    for rank_result in results:
        plain = {k: v for k, v in rank_result.items() if "/" in k}
        for name, run in plain.items():
            # the clipping norm's summation order follows the partition: compare within one partitioner
            reference = plain[
                name.split("/")[0].replace("_view", "").replace("bucket", "per_shard") + "/broadcast/False"
            ]
            assert run["params"] == reference["params"], name
            assert run["evals"] == reference["evals"], name
            assert run["state"] == reference["state"], name
            if name.endswith("/True"):
                assert run["first_use"] == FIRST_USE, name  # rank 0's order, adopted by rank 1 too
                assert run["single_buffer_warning"] == (run["units"] == 1), name
        assert rank_result["flat_capped/broadcast/True"]["units"] == 3
        assert rank_result["flat_view/broadcast/True"]["single_buffer_warning"]
        assert rank_result["overlap_prefetch"]["params"] == rank_result["overlap"]["params"]
        assert rank_result["overlap_prefetch"]["evals"] == rank_result["overlap"]["evals"]
        assert {k for k in plain if "/all_reduce/" in k} == {f"{layout}/all_reduce/False" for layout in LAYOUTS}
        assert plain["bucket/all_reduce/False"]["report"]["mode"] == "bucket_all_reduce"
        assert len(set(rank_result["transposed"].values())) == 1
        assert rank_result["transposed"] == results[0]["transposed"]  # every replica whole
        registered = rank_result["auto_with_all_reduce"]
        # auto times the collectives that fill a unit in place only: the registered all-reduce stages
        assert tuple(registered["report"]["timings_s"]) == AUTO == ("broadcast", "p2p_all_gather")
        assert registered["params"] == plain["per_shard/broadcast/False"]["params"]
    for name in (k for k in results[0] if k.endswith("/auto/False")):
        reports = [r[name]["report"] for r in results]
        assert_auto_rule(reports[0], AUTO)  # in preference order; a near-tie goes to the preferred one
        assert all(r == reports[0] for r in reports), name  # every rank chose the same, from the same figures
