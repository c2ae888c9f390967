"""With a prefetched exchange in flight, whatever reads parameters or optimizer state waits first.

One W=2 world runs every scenario twice, ``prefetch_exchange`` on and off, on the tied/shared/
out-of-order model of ``test_exchange``, and records zero_lab's own ``record_function`` labels
(``zero_lab::<op>`` at issue, ``zero_lab::<op>/wait`` at the wait) under the profiler:

* in one training run, each reader (``consolidate_state_dict``, ``state_dict``,
  ``save_checkpoint``, ``clip_grad_norm_``, a second ``step``, an eval forward under
  ``no_grad``) is called right after an ``opt.step()`` issued the exchange; every unit
  the step issued must be waited for before the reader's first collective. ``zero_grad``
  must *not* wait (it touches only ``.grad``; waiting there would serialise the exchange
  before every next forward);
* Join with uneven inputs: every exchange a rank issued is waited for before each of its
  ``join_flags`` all-reduces; the Join gradient broadcast is labelled and its bytes counted;
* overlap hooks (+ prefetch), both hooks, with DdpBucket (whole and ``shard_buckets``) and Flat: the hooks'
  sends are labelled, counted (each element once per step) and, with prefetch, waited for by
  the next forward (the sends themselves are issued on Gloo's callback threads, which the
  profiler does not record); Manual(order=...) with prefetch;

and each prefetch run must end bitwise equal to the same sequence without prefetch.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from tests.dist.training import TiedLM
from zero_lab import Flat, Manual, ZeroRedundancyOptimizer
from zero_lab.checkpoint import save_checkpoint
from zero_lab.collectives import COLLECTIVES, collective_named
from zero_lab.ddp_buckets import ddp_bucket_map
from zero_lab.overlap import hook_with_zero_step, hook_with_zero_step_interleaved, prefetch_exchange
from zero_lab.partition import Partitioner

READERS = ("consolidate_state_dict", "state_dict", "save_checkpoint", "clip_grad_norm_", "step", "eval_forward")
EXCHANGE_OPS = (*(f"zero_lab::{collective_named(name).label}" for name in COLLECTIVES), "zero_lab::overlap_broadcast")
WAITS = tuple(f"{op}/wait" for op in EXCHANGE_OPS)
MARK = "test::reader"
#: Marks the wait that ends each profiled block: nothing of zero_lab's is in flight (issued, labelled,
#: on Gloo's callback threads) when the profiler stops. A rank once died of SIGSEGV after an
#: overlap run's profiler stopped with the prefetched sends still going; what follows is not counted.
DRAIN = "test::drain"
#: name: (partitioner, shard_buckets, interleaved hook)
OVERLAP_CASES: dict[str, tuple[Partitioner | None, bool, bool]] = {
    "ddp_bucket": (None, False, True),
    "shard": (None, True, True),
    "flat": (Flat(), False, True),
    "after_all": (None, False, False),
}


def _tokens(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(100 * step + rank))


def _backward(ddp: nn.Module, step: int) -> None:
    idx = _tokens(step, dist.get_rank())
    nn.functional.cross_entropy(ddp(idx).flatten(0, 1), idx.flatten()).backward()


def _build(
    prefetch: bool,
    partitioner: Partitioner | None = None,
    overlap: bool = False,
    shard: bool = False,
    interleaved: bool = True,
):
    model = TiedLM()
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets on this small model
    opt = ZeroRedundancyOptimizer(
        model.named_parameters(),
        torch.optim.Adam,
        partitioner=partitioner,
        overlap_with_ddp=overlap,
        ddp_buckets=ddp_bucket_map(ddp) if overlap else None,  # partitioned along these buckets, as the app does
        exchange="broadcast",
        lr=1e-2,
    )
    if overlap:
        wrap = hook_with_zero_step_interleaved if interleaved else hook_with_zero_step
        ddp.register_comm_hook(None, wrap(allreduce_hook, ddp, opt, shard_buckets=shard))
    handle = prefetch_exchange(model, opt) if prefetch else None
    return model, ddp, opt, handle


def _finish(model: nn.Module, handle: Any) -> list[torch.Tensor]:
    if handle is not None:
        handle.remove()
    return [p.detach().clone() for p in model.parameters()]


def _drain(opt: ZeroRedundancyOptimizer) -> None:
    """Wait for every exchange in flight, under :data:`DRAIN` (the last event :func:`_events` keeps)."""
    with record_function(DRAIN):
        opt.wait_for_exchange()


def _events(prof: Any) -> list[tuple[float, str]]:
    """zero_lab's labels and the test's own marks, in start order, up to :data:`DRAIN`: ``(start_us, name)``."""
    events = sorted((e.time_range.start, e.name) for e in prof.events() if e.name.startswith(("zero_lab::", "test::")))
    return events[: next((i for i, (_, name) in enumerate(events) if name == DRAIN), len(events))]


def _read(reader: str, model: nn.Module, opt: ZeroRedundancyOptimizer, directory: Path) -> Any:
    if reader == "consolidate_state_dict":
        return opt.consolidate_state_dict(to=0)
    if reader == "state_dict":
        return opt.state_dict() if dist.get_rank() == 0 else None
    if reader == "save_checkpoint":
        return save_checkpoint(directory, opt, model)
    if reader == "clip_grad_norm_":
        return opt.clip_grad_norm_(1.0)
    if reader == "step":
        return opt.step()  # the last backward's gradients, stepped a second time without a forward
    if reader == "zero_grad":
        return opt.zero_grad()
    model.eval()
    with torch.no_grad():
        out = model(_tokens(99, 0))
    model.train()
    return out


def _readers_run(prefetch: bool, directory: Path) -> dict[str, Any]:
    """One training run: each reader right after a step issued its exchange (two plain steps first)."""
    model, ddp, opt, handle = _build(prefetch)
    for step in range(2):
        opt.zero_grad()
        _backward(ddp, step)
        opt.step()
    out: dict[str, Any] = {}
    for step, reader in enumerate((*READERS, "zero_grad"), start=2):
        if reader == "state_dict":
            opt.consolidate_state_dict(to=0)
        opt.zero_grad()
        _backward(ddp, step)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            opt.step()
            with record_function(MARK):
                value = _read(reader, model, opt, directory / reader)
            _drain(opt)
        events = _events(prof)
        mark = next(i for i, (_, name) in enumerate(events) if name == MARK)
        in_reader = [name for _, name in events[mark + 1 :]]
        first_other = next((i for i, name in enumerate(in_reader) if name not in WAITS), len(in_reader))
        out[reader] = {
            "issued": sum(name in EXCHANGE_OPS for _, name in events[:mark]),
            "waited_first": first_other,
            "waited_in_reader": sum(name in WAITS for name in in_reader),
            "value": value.detach().clone() if torch.is_tensor(value) else None,
        }
    out["params"] = _finish(model, handle)
    return out


def _join_run(prefetch: bool) -> dict[str, Any]:
    """Rank 1 runs out of inputs one step before rank 0 (steps 3 and 2)."""
    model, ddp, opt, handle = _build(prefetch)
    rank = dist.get_rank()
    before = opt.comm_stats.snapshot()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with Join([ddp, opt]):
            for step in range(3 - rank):
                opt.zero_grad()
                _backward(ddp, step)
                opt.step()
        _drain(opt)
    used = opt.comm_stats.since(before)
    events = [name for _, name in _events(prof)]
    unbalanced = [
        sum(n in EXCHANGE_OPS for n in events[:i]) - sum(n in WAITS for n in events[:i])
        for i, name in enumerate(events)
        if name == "zero_lab::join_flags"
    ]
    rank1_numel = sum(s.numel for s in opt.partition.shards_of(1))
    return {
        "unbalanced_at_join_flags": unbalanced,
        "join_grads_labels": events.count("zero_lab::join_grads"),
        "bytes": used.bytes,
        "rank1_bytes": 4 * rank1_numel,
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "num_params": len(list(model.parameters())),
        "params": _finish(model, handle),
    }


def _overlap_run(prefetch: bool, partitioner: Partitioner | None, shard: bool, interleaved: bool) -> dict[str, Any]:
    """Overlap hooks: three iterations, the third's bytes and the waits of the hooks' sends recorded."""
    model, ddp, opt, handle = _build(prefetch, partitioner, overlap=True, shard=shard, interleaved=interleaved)
    for step in range(2):
        opt.zero_grad()
        _backward(ddp, step)
        opt.step()
    before = opt.comm_stats.snapshot()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt.zero_grad()
        idx = _tokens(2, dist.get_rank())
        with record_function("test::forward"):
            logits = ddp(idx)
        with record_function("test::backward"):
            nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
        opt.step()
        _drain(opt)
    used = opt.comm_stats.since(before)
    events = [name for _, name in _events(prof)]
    forward = events[events.index("test::forward") : events.index("test::backward")]
    return {
        "waits_in_forward": forward.count("zero_lab::overlap_broadcast/wait"),
        "waits": events.count("zero_lab::overlap_broadcast/wait"),
        "bytes": used.bytes,
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "params": _finish(model, handle),
    }


def _manual_run(prefetch: bool) -> dict[str, Any]:
    model, ddp, opt, handle = _build(prefetch, Manual(order=["late.*", "embed.*", "shared.*"]))
    for step in range(3):
        opt.zero_grad()
        _backward(ddp, step)
        opt.step()
    return {"owners": opt.partition.owners(), "params": _finish(model, handle)}


def waits_everywhere(directory: str) -> dict[str, Any]:
    """Rank program: every scenario with prefetch on and off."""
    rank_dir = Path(directory)
    out: dict[str, Any] = {}
    for prefetch in (True, False):
        out[f"readers/{prefetch}"] = _readers_run(prefetch, rank_dir / f"readers-{prefetch}")
        out[f"join/{prefetch}"] = _join_run(prefetch)
        for name, args in OVERLAP_CASES.items():
            out[f"overlap_{name}/{prefetch}"] = _overlap_run(prefetch, *args)
        out[f"manual/{prefetch}"] = _manual_run(prefetch)
    return out


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_readers_wait_for_the_exchange_in_flight_and_results_stay_bitwise(world):
    with tempfile.TemporaryDirectory() as directory:
        results = world(waits_everywhere, 2, directory)
    for rank, rows in enumerate(results):
        readers_on, readers_off = rows["readers/True"], rows["readers/False"]
        for reader in READERS:
            on, off = readers_on[reader], readers_off[reader]
            assert on["issued"] > 0 and on["issued"] == off["issued"], reader
            if reader != "state_dict" or rank == 0:  # state_dict is read on the rank it was consolidated to
                assert on["waited_first"] == on["issued"], (reader, rank, on)
            assert off["waited_first"] == 0, reader  # synchronous: the step itself waited
            if on["value"] is not None:
                assert torch.equal(on["value"], off["value"]), reader
        assert readers_on["zero_grad"]["waited_in_reader"] == 0
        assert _equal(readers_on["params"], readers_off["params"])

        join_on, join_off = rows["join/True"], rows["join/False"]
        assert join_on["unbalanced_at_join_flags"] and set(join_on["unbalanced_at_join_flags"]) == {0}
        assert join_on["join_grads_labels"] == 1  # rank 1 joined for one step: one gradient broadcast
        # per step-like call: a W-float join_flags all-reduce and one exchange of every element;
        # once: rank 1's shard gradients broadcast to it; with prefetch, once: the agreed
        # first-use order (one int64 per parameter)
        expected = 3 * (4 * 2 + join_on["model_bytes"]) + join_on["rank1_bytes"]
        assert join_off["bytes"] == expected
        assert join_on["bytes"] == expected + 8 * join_on["num_params"]
        assert _equal(join_on["params"], join_off["params"])

        for name in OVERLAP_CASES:
            on, off = rows[f"overlap_{name}/True"], rows[f"overlap_{name}/False"]
            # the hooks' sends are issued on Gloo's callback threads, which the profiler does not
            # record; their waits (main thread) carry the label: synchronous, in the backward;
            # with prefetch, all of the previous iteration's in the next forward
            assert off["waits"] > 1 and off["waits_in_forward"] == 0, name
            assert on["waits"] == on["waits_in_forward"] == off["waits"], name
            assert on["bytes"] == off["bytes"] == on["model_bytes"], name  # each element sent once per step
            assert _equal(on["params"], off["params"]), name

        manual_on, manual_off = rows["manual/True"], rows["manual/False"]
        assert sorted(set(manual_on["owners"])) == [0, 1]
        assert _equal(manual_on["params"], manual_off["params"])
    for key in results[0]:
        assert _equal(results[0][key]["params"], results[1][key]["params"]), key  # replicas identical
