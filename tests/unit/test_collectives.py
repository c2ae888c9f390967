"""The collective registry and the built-in collectives in a world of one (in-process Gloo group).

``COLLECTIVES`` / ``EXCHANGES`` come from the registry; a registered class is accepted by
``exchange=`` (and named in the error for an unknown one); bad registrations are refused;
each collective's ``nbytes`` is what the Communicator meters for one ``issue``, under its label.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import profile

from tests.padded_all_reduce import PaddedAllReduce
from tests.registries import no_decisions, restored_registries
from zero_lab import ZeroRedundancyOptimizer, exchange
from zero_lab.collectives import (
    COLLECTIVES,
    EXCHANGES,
    AllGather,
    Broadcast,
    Collective,
    InFlight,
    P2PAllGather,
    collective_named,
    register_collective,
    registered_collectives,
)
from zero_lab.comm import Communicator


@pytest.fixture
def registry():
    """Registrations made in a test vanish after it."""
    with restored_registries():
        yield


def test_the_constants_are_derived_from_the_registry():
    # the opt-in shm_all_gather is registered (a value of exchange=) but not one of auto's candidates
    assert COLLECTIVES == ("broadcast", "all_gather", "p2p_all_gather")
    assert registered_collectives() == (*COLLECTIVES, "shm_all_gather")
    assert EXCHANGES == ("auto", "broadcast", "all_gather", "p2p_all_gather", "shm_all_gather")
    assert exchange.auto_collectives() == ("broadcast", "p2p_all_gather")
    assert exchange.COLLECTIVES is COLLECTIVES and exchange.EXCHANGES is EXCHANGES
    assert isinstance(collective_named("broadcast"), Broadcast)
    assert isinstance(collective_named("all_gather"), AllGather)
    assert isinstance(collective_named("p2p_all_gather"), P2PAllGather)
    assert all(isinstance(collective_named(name), Collective) for name in COLLECTIVES)


def test_a_registered_collective_is_an_exchange(single_rank_group, registry):
    params = nn.Linear(3, 2).parameters()
    with pytest.raises(
        ValueError,
        match=r"exchange='all_reduce' is not one of \['auto', 'broadcast', 'all_gather', 'p2p_all_gather', 'shm_all",
    ):
        ZeroRedundancyOptimizer(params, torch.optim.Adam, exchange="all_reduce", lr=1e-2)
    assert register_collective(PaddedAllReduce) is PaddedAllReduce
    register_collective(PaddedAllReduce)  # again: a no-op
    assert registered_collectives() == ("broadcast", "all_gather", "p2p_all_gather", "shm_all_gather", "all_reduce")
    opt = ZeroRedundancyOptimizer(nn.Linear(3, 2).parameters(), torch.optim.Adam, exchange="all_reduce", lr=1e-2)
    assert opt.exchange_report().requested == "all_reduce"
    with pytest.raises(
        ValueError,
        match=r"not one of \['auto', 'broadcast', 'all_gather', 'p2p_all_gather', 'shm_all_gather', 'all_reduce'\]",
    ):
        collective_named("ring")


def test_bad_registrations_say_what_is_wrong(registry):
    class NoIssue:
        name, label, in_place_shards = "no_issue", "exchange_no_issue", False

    class Auto(PaddedAllReduce):
        name = "auto"

    class Clash(PaddedAllReduce):
        name = "broadcast"

    with pytest.raises(TypeError, match="NoIssue is not a Collective: it needs name, label"):
        register_collective(NoIssue)
    with pytest.raises(ValueError, match="name='auto' is taken"):
        register_collective(Auto)
    with pytest.raises(ValueError, match="exchange='broadcast' is already Broadcast; give Clash another name"):
        register_collective(Clash)
    assert registered_collectives() == (*COLLECTIVES, "shm_all_gather")


@pytest.mark.parametrize(
    "collective", [Broadcast(), AllGather(), P2PAllGather(), PaddedAllReduce()], ids=lambda c: c.name
)
def test_one_issue_meters_nbytes_under_its_label(single_rank_group, collective):
    comm = Communicator()
    storage = torch.arange(6, dtype=torch.float32)
    with profile() as prof:
        collective.issue(comm, storage, [(0, 6)], collective.label).wait()
    assert comm.stats.bytes == collective.nbytes([(0, 6)], storage.element_size()) == 24
    assert comm.stats.calls == 1
    assert torch.equal(storage, torch.arange(6.0))  # one rank owns it all: nothing changes
    labels = {e.name for e in prof.events()}
    # point to point, a world of one has no peer: nothing issued, so nothing to wait for
    waited = set() if isinstance(collective, P2PAllGather) else {f"zero_lab::{collective.label}/wait"}
    assert {f"zero_lab::{collective.label}", *waited} <= labels


def test_nbytes_of_uneven_ranges():
    bounds = [(0, 3), (3, 3), (3, 8)]  # rank 1 owns nothing
    assert Broadcast().nbytes(bounds, 4) == 32  # two broadcasts, 3 + 5 elements
    assert AllGather().nbytes(bounds, 4) == 60  # padded to the longest: 3 x 5 elements
    assert P2PAllGather().nbytes(bounds, 4) == 32  # the whole output, unpadded, as an all-gather counts it


def test_in_flight_then_runs_after_its_own_finish(single_rank_group):
    done: list[str] = []
    inflight = InFlight(Communicator().issue_broadcasts([]), lambda: done.append("unpad"))
    inflight.then(lambda: done.append("copy out")).wait()
    assert done == ["unpad", "copy out"]


def test_auto_keeps_the_preferred_candidate_unless_another_is_clearly_faster():
    from zero_lab.auto import AUTO_MARGIN, CLEAR, decide

    assert (AUTO_MARGIN, CLEAR) == (0.10, 0.8)
    tight = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8] * 2
    # the same times, a little apart: a near-tie, the preferred one, whichever measured faster
    assert decide({"broadcast": [t * 1.05 for t in tight], "p2p_all_gather": tight}) == (
        "broadcast",
        ("p2p_all_gather",),
    )
    # 15 % apart in every sample: clearly faster, it wins and nothing is within the noise of it
    assert decide({"broadcast": [t * 1.15 for t in tight], "p2p_all_gather": tight}) == ("p2p_all_gather", ())
    # 15 % apart at the median but the samples overlap: noise, the preferred one stays
    overlapping = [8.0, 12.5, 9.0, 12.0, 10.0, 11.0] * 2
    assert decide({"broadcast": [t * 1.15 for t in overlapping], "p2p_all_gather": overlapping})[0] == "broadcast"
    # disturbed samples (a heavy tail, on both) do not hide a candidate 16 times slower
    slow = [t * 16 for t in tight[:11]] + [2000.0]
    assert decide({"slow": slow, "plain": [*tight[:10], 400.0, 300.0]}) == ("plain", ())
    # the choice is the first preferred that nothing is clearly faster than, not merely the fastest
    three = {"a": [t * 2 for t in tight], "b": [t * 1.04 for t in tight], "c": tight}
    assert decide(three) == ("b", ("c",))
    with pytest.raises(ValueError, match="no candidate"):
        decide({})


def test_a_decision_is_remembered_per_key_in_the_process():
    from zero_lab.auto import Decision, decided, remember

    key = ("exchange", (0, 1), "gloo", "torch.float32", "cpu", "flat", (("broadcast", (64,)),))
    with no_decisions():
        assert decided(key) is None
        remember(key, Decision("broadcast", {"broadcast": 1.0}, {"broadcast": 0.1}, (), 64))
        assert decided(key) == Decision("broadcast", {"broadcast": 1.0}, {"broadcast": 0.1}, (), 64)
    assert decided(key) is None  # the test's decisions are gone with it
