"""Host-local shared memory (:mod:`zero_lab.host_shm`) under the engine and the DDP path, against DDP.

The engine with ``grad_reduce=shm_reduce_scatter`` / ``shm_all_reduce`` and ``exchange=shm_all_gather``
is bitwise DDP + the same optimizer at W=2 (prefetch on and off, accumulate=2, two partitioners),
within 1e-6 at W=3 and with shard groups (``shard_size`` < W); it sends exactly the bytes of
``reduce_scatter`` + ``p2p_all_gather``; the DDP path (a comm hook and the ZeRO optimizer's exchange)
is bitwise DDP + Adam; a peer that stops posting raises the one-line timeout naming it; and no
mailbox file is left in ``/dev/shm`` once set up, nor after a rank is killed. They are the engine's
default here; where the mailboxes are refused, the default goes over Gloo and says why.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist.test_engine import EngineCase, _train_pair
from tests.dist.training import accumulated_backward, batch, loss_of, make_model
from zero_lab import ShardedDataParallel, ZeroRedundancyOptimizer, host_shm, reduce_gradients
from zero_lab.comm import Communicator, set_group_timeout

SHM = {"grad_reduce": "shm_reduce_scatter", "exchange": "shm_all_gather"}

W2_CASES = [
    EngineCase("flat", prefetch=True, **SHM),
    EngineCase("flat", prefetch=False, accumulate=2, **SHM),
    EngineCase("sorted_greedy", prefetch=True, accumulate=2, **SHM),
    EngineCase("sorted_greedy", prefetch=False, optimizer="adamw", **SHM),
    EngineCase("flat", grad_reduce="shm_all_reduce", exchange="p2p_all_gather"),
    EngineCase("flat", grad_reduce="reduce_scatter", exchange="shm_all_gather"),
]


def _sent(grad_reduce: str, exchange: str) -> int:
    model = make_model(seed=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine = ShardedDataParallel(model, opt, bucket_cap_mb=0.001, grad_reduce=grad_reduce, exchange=exchange)
    for step in range(2):
        opt.zero_grad()
        loss_of(engine, batch(step, dist.get_rank())).backward()
        opt.step()
    engine.close()
    return engine.comm_stats.sent_bytes


def _ddp_path(zero: bool, steps: int = 4) -> float:
    """DDP + Adam against DDP with the shm reduce-scatter hook + the ZeRO optimizer's shm exchange (``zero``),
    or against DDP + Adam with its all-reduce as the shm_all_reduce hook (the benchmark's control)."""
    rank = dist.get_rank()
    reference, model = make_model(), make_model()
    ddp_ref, ddp = DDP(reference), DDP(model)
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    if zero:
        opt: Any = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.Adam, lr=1e-2, exchange="shm_all_gather")
        handle = reduce_gradients(ddp, opt, "shm_reduce_scatter")
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        handle = reduce_gradients(ddp, opt, "shm_all_reduce")
    for step in range(steps):
        for wrapped, optimizer in ((ddp_ref, plain), (ddp, opt)):
            optimizer.zero_grad()
            accumulated_backward(wrapped, step, rank)
            optimizer.step()
    if zero:
        opt.wait_for_exchange()
    handle.close()
    return max((a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters()))


def _w2_program() -> dict[str, Any]:
    parity = [_train_pair(case, make_model) for case in W2_CASES]
    sent_shm = _sent("shm_reduce_scatter", "shm_all_gather")
    return {
        "parity": parity,
        "sent_shm": sent_shm,
        "open_after_close": len(host_shm._OPEN),  # every engine closed: its mailboxes unmapped
        "sent_p2p": _sent("reduce_scatter", "p2p_all_gather"),
        "ddp_path": _ddp_path(zero=True),
        "ddp_hook": _ddp_path(zero=False),
        "left": host_shm.leftover_files([os.getpid()]),
    }


def test_engine_and_ddp_path_bitwise_at_two_ranks(world):
    for rank_result in world(_w2_program, 2):
        for case, result in zip(W2_CASES, rank_result["parity"]):
            assert result["diff"] == 0.0 and result["losses_equal"], (case, result)
            assert result["in_flight"] == 0 and 0 < result["peak"] <= result["bound"], (case, result)
        assert rank_result["sent_shm"] == rank_result["sent_p2p"] > 0 and rank_result["open_after_close"] == 0
        assert rank_result["ddp_path"] == 0.0 and rank_result["ddp_hook"] == 0.0
        assert rank_result["left"] == []


def _primitives(slots: int, slot_bytes: int) -> dict[str, Any]:
    """The three collectives on their own mailboxes (small slots: big tensors go in pieces, more
    messages than slots in flight) against the Gloo point-to-point ones and each other."""
    from zero_lab.collectives import collective_named
    from zero_lab.grad_reduce import grad_reduce_named

    rank, world = dist.get_rank(), dist.get_world_size()
    comm, gloo = Communicator(dist.new_group(list(range(world)))), Communicator()
    host_shm.attach(comm, slots=slots, slot_bytes=slot_bytes)
    g = torch.Generator().manual_seed(rank)
    sizes = [1000 + 517 * r for r in range(world)]  # unequal segments
    tensors = [torch.randn(sum(sizes), generator=g) for _ in range(5)]
    out: dict[str, Any] = {"rs_equal": [], "ar_same": [], "ag_equal": []}
    issued = []
    for tensor in tensors:  # five reductions in flight at once, then waited
        mine, p2p = tensor.clone(), tensor.clone()
        cuts = torch.tensor(sizes).cumsum(0).tolist()
        split = lambda t: list(t.split(sizes))  # noqa: E731
        issued.append((grad_reduce_named("shm_reduce_scatter").issue(comm, split(mine), tag=0), mine, p2p, split))
    for reduced, _mine, p2p, split in issued:
        got = reduced.wait()
        want = grad_reduce_named("reduce_scatter").issue(gloo, split(p2p), tag=1).wait()
        out["rs_equal"].append(torch.equal(got, want))
    whole = tensors[0].clone()
    grad_reduce_named("shm_all_reduce").issue(comm, [whole], tag=2).wait()
    everyone = gloo.all_gather_objects(whole)
    out["ar_same"] = all(torch.equal(everyone[0], t) for t in everyone)
    reference = tensors[0].clone()
    gloo.all_reduce(reference)
    out["ar_close"] = (whole - reference).abs().max().item()
    bounds = [(a - s, a) for a, s in zip(cuts, sizes)]
    storage = torch.full((sum(sizes),), float("nan"))
    start, stop = bounds[rank]
    storage[start:stop] = float(rank)
    collective_named("shm_all_gather").issue(comm, storage, bounds, "test").wait()
    out["ag_equal"] = all(bool((storage[a:b] == r).all()) for r, (a, b) in enumerate(bounds))
    host_shm.release(comm)
    return out


def _w3_program() -> dict[str, Any]:
    cases = [EngineCase("flat", **SHM), EngineCase("sorted_greedy", prefetch=False, accumulate=2, **SHM)]
    return {
        "parity": [_train_pair(case, make_model) for case in cases],
        "primitives": _primitives(slots=2, slot_bytes=4096),
        "left": host_shm.leftover_files([os.getpid()]),
    }


def test_three_ranks_within_1e6_and_primitives_equal_gloo(world):
    for rank_result in world(_w3_program, 3):
        for result in rank_result["parity"]:
            assert result["diff"] <= 1e-6 and result["in_flight"] == 0, result
        prims = rank_result["primitives"]
        assert prims["rs_equal"] == [True] * 5  # the same rank-order sum as the point-to-point reduce-scatter
        assert prims["ar_same"] and prims["ar_close"] <= 1e-6 and prims["ag_equal"]
        assert rank_result["left"] == []


def _shard_groups_program() -> float:
    case = EngineCase("flat", prefetch=False, **SHM)
    reference, model = make_model(), make_model()
    ddp = DDP(reference)
    plain = torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine = ShardedDataParallel(model, opt, shard_size=2, bucket_cap_mb=0.001, prefetch=case.prefetch, **SHM)
    for step in range(3):
        for wrapped, optimizer in ((ddp, plain), (engine, opt)):
            optimizer.zero_grad()
            accumulated_backward(wrapped, step, dist.get_rank())
            optimizer.step()
    engine.close()
    return max((a - b).abs().max().item() for a, b in zip(reference.parameters(), model.parameters()))


def test_shard_groups_of_two_in_a_world_of_four(world):
    # the shard groups go through shared memory, the replicas' all-reduce through Gloo
    assert all(diff <= 1e-6 for diff in world(_shard_groups_program, 4))


def _refused_and_silent(directory: str) -> dict[str, str]:
    """Ranks that do not share a /dev/shm are refused on every rank; then rank 1 never posts its
    part, and rank 0's wait raises the timeout naming it."""
    out = {}
    set_group_timeout(timedelta(seconds=1))
    comm = Communicator(dist.new_group([0, 1]))
    shared = host_shm.SHM_DIR
    host_shm.SHM_DIR = directory if dist.get_rank() == 1 else shared  # rank 1 in a /dev/shm of its own
    try:
        host_shm.attach(comm)
    except host_shm.Refused as error:
        out["apart"] = str(error)
    host_shm.SHM_DIR = shared
    dist.barrier()  # rank 1 has unlinked its file
    out["left_apart"] = str(os.listdir(directory))
    host_shm.attach(comm)
    if dist.get_rank() == 0:
        try:
            host_shm.reduce_scatter(comm, list(torch.ones(8).split(4)), op="grad_shm_reduce_scatter", tag=7).wait()
        except TimeoutError as error:
            out["silent"] = str(error)
    return out


def _tiny() -> torch.nn.Module:
    """26 parameters: every message is smaller than a mailbox's smallest slot."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 2))


def _default_or_refused(directory: str) -> list[dict[str, Any]]:
    """The engine with its default modes, first where the mailboxes can be set up, then where rank 1
    has a /dev/shm of its own (refused on every rank: the engine goes over Gloo and says why)."""
    here = _train_pair(EngineCase("flat"), make_model)
    tiny = _train_pair(EngineCase("flat"), _tiny)
    shared = host_shm.SHM_DIR
    host_shm.SHM_DIR = directory if dist.get_rank() == 1 else shared
    try:
        apart = _train_pair(EngineCase("flat", accumulate=2), make_model)
    finally:
        host_shm.SHM_DIR = shared
    return [here, tiny, apart]


def test_the_default_goes_through_shared_memory_and_over_gloo_where_it_is_refused(world, tmp_path):
    for here, tiny, apart in world(_default_or_refused, 2, str(tmp_path)):
        assert here["modes"] == tiny["modes"] == ("shm_reduce_scatter", "shm_all_gather", "")
        grad_reduce, exchange, note = apart["modes"]
        assert (grad_reduce, exchange) == ("reduce_scatter", "p2p_all_gather")
        assert note.startswith("host shared memory refused, over Gloo: host_shm: rank 0 cannot open ")
        assert "the ranks do not share /dev/shm" in note and "\n" not in note
        for result in (here, tiny, apart):
            assert result["diff"] == 0.0 and result["losses_equal"] and result["in_flight"] == 0, result


def test_refusals_and_a_silent_peer_in_one_line_naming_it(world, tmp_path):
    results = world(_refused_and_silent, 2, str(tmp_path))
    # each rank misses the other's file: every rank raises the first rank's line, nothing is left behind
    apart = results[0]["apart"]
    assert apart == results[1]["apart"] and apart.startswith("host_shm: rank 0 cannot open /dev/shm/zero_lab-shm-")
    assert "the ranks do not share /dev/shm" in apart and "\n" not in apart
    assert [r["left_apart"] for r in results] == ["[]", "[]"]
    message = results[0]["silent"]
    assert message.startswith("host_shm: rank 1 did not post its part within 1 s (grad_shm_reduce_scatter, tag 7")
    assert "\n" not in message and "dist.timeout_s" in message


def _killed_peer(directory: str) -> str:
    """Every rank sets up, says its pid, then rank 1 is killed; rank 0 waits for it in vain."""
    set_group_timeout(timedelta(seconds=1))
    comm = Communicator(dist.new_group([0, 1]))
    host_shm.attach(comm)
    with open(os.path.join(directory, f"pid{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    dist.barrier()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    host_shm.all_reduce(comm, torch.ones(16), op="grad_shm_all_reduce", tag=3).wait()
    return "unreachable"


def test_nothing_left_in_dev_shm_after_a_rank_is_killed(world, tmp_path):
    from zero_lab.runtime.spawn import RankFailure

    with pytest.raises(RankFailure) as caught:
        world(_killed_peer, 2, str(tmp_path), timeout_s=60)
    # the killed rank is the cause. Rank 0's own line (its 1 s wait ending) is not asserted here: the
    # world gathers other ranks' reports for 2 s only and then stops them, which on a loaded host can
    # come first (it did under 4 test workers and a busy process on 2 cores); the line itself is
    # tested with a live silent peer (test_refusals_and_a_silent_peer_in_one_line_naming_it)
    assert caught.value.rank == 1 and caught.value.exitcode == -signal.SIGKILL
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    assert host_shm.leftover_files(pids) == []
