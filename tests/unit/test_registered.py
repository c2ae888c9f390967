"""``exchange=`` and ``grad_reduce=`` read the core's registries as they are when the job is checked
and built, not an enum frozen at import: a collective registered after import is a choice by name,
a class of yours by its dotted path (imported and registered, like a ``_target_``); anything else
is one line naming the key and both fixes."""

from __future__ import annotations

import pytest

from tests.padded_all_reduce import PaddedAllReduce
from tests.preflight import compose_job
from tests.registries import restored_registries
from zero_lab import grad_reduce
from zero_lab.app.check.rules import ConfigError, check
from zero_lab.app.config.registered import exchange_name, grad_reduce_name
from zero_lab.collectives import register_collective, registered_collectives

PADDED = "tests.padded_all_reduce.PaddedAllReduce"


@pytest.fixture
def registries():
    """Registrations made in a test vanish after it."""
    with restored_registries():
        yield


def problems(*overrides: str) -> list[str]:
    cfg, choices, _ = compose_job(list(overrides))
    try:
        check(cfg, choices)
    except ConfigError as error:
        return error.problems
    return []


def test_a_collective_registered_after_import_is_chosen_by_name(registries):
    assert (exchange_name("auto"), exchange_name("broadcast")) == ("auto", "broadcast")
    (refused,) = problems("exchange=all_reduce")
    assert refused == (
        "exchange=all_reduce: not a registered name (auto, broadcast, all_gather, p2p_all_gather, shm_all_gather); "
        "give the dotted "
        "path of a zero_lab.collectives.Collective class of yours (exchange=my_project.MyClass), or register it "
        "before the job starts"
    )
    register_collective(PaddedAllReduce)  # after zero_lab.app.config.schema was imported
    assert problems("exchange=all_reduce") == []
    assert exchange_name("all_reduce") == "all_reduce"


def test_a_class_of_yours_by_its_dotted_path_is_registered_and_used_by_name(registries):
    assert "all_reduce" not in registered_collectives()
    assert problems(f"exchange={PADDED}") == []
    assert registered_collectives()[-1] == "all_reduce"
    assert exchange_name(PADDED) == "all_reduce"  # again: the same class, a no-op


def test_what_is_no_strategy_class_is_refused_naming_the_key(registries):
    (system,) = problems("exchange=os.system")
    assert system.startswith("exchange._target_=os.system: ")
    (function,) = problems("exchange=tests.unit.test_registered.problems")
    assert function == (
        "exchange=tests.unit.test_registered.problems: a function, not a class (zero_lab.collectives.Collective)"
    )
    (strategy,) = problems(f"grad_reduce={PADDED}")
    assert strategy == (
        f"grad_reduce={PADDED}: PaddedAllReduce is not a GradReduce: it needs name, label, scatters, issue() and "
        "sent_bytes()"
    )
    assert (
        "grad_reduce=ring: not a registered name (auto, all_reduce, reduce_scatter" in problems("grad_reduce=ring")[0]
    )
    assert grad_reduce_name(None) is None and grad_reduce_name("reduce_scatter") == "reduce_scatter"


class KeepMine:
    """A gradient reduction of the user's: DDP's all-reduce, then each rank keeps its own segment."""

    name, label, scatters = "keep_mine", "grad_keep_mine", True

    def issue(self, comm, segments, tag):
        raise NotImplementedError  # never called: the check and the lookup build nothing

    def sent_bytes(self, numels, itemsize, world_size):
        return 2 * sum(numels) * itemsize * (world_size - 1) // world_size


def test_a_gradient_reduction_of_yours_by_its_dotted_path(registries):
    path = f"{__name__}.KeepMine"
    assert problems(f"grad_reduce={path}") == []
    assert grad_reduce_name(path) == "keep_mine" and grad_reduce_name("keep_mine") == "keep_mine"
    assert grad_reduce.registered_grad_reduces()[-1] == "keep_mine"
