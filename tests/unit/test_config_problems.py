"""One problem, one line (zero_lab/app/config/problems.py): an interpolation that
fails in every check is one line, or none when the model/data mismatch behind it is reported;
``partitioner=manual`` takes exactly one of ``order`` and ``params_per_rank``; an argument Hydra
cannot parse is named, and several overrides in one argument are said to be that."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from tests.preflight import preflight, problems
from zero_lab.partition import ParamSpec


def lines(message: str) -> list[str]:
    """The problem lines of a ConfigError's text (after its first line)."""
    return [line.removeprefix("  - ") for line in message.splitlines()[1:]]


def test_a_model_data_mismatch_is_one_problem_not_its_failed_interpolations():
    message = problems("model=mlp", "data=tokens")
    assert message.startswith("invalid config (1 problem):")
    assert lines(message) == [
        "data=tokens: model=mlp is a 'regression' model and needs data for that task, but this data's task is 'lm' "
        "(pick data=regression; zero_lab/app/workloads/protocols.py)"
    ]


def test_a_failed_interpolation_of_its_own_is_one_line_naming_the_key():
    assert lines(problems("model=transformer", "data=tokens", "data.global_batch=${model.nope}")) == [
        "data.global_batch: follows ${model.nope}, but model=transformer has no nope; set data.global_batch=<value>, "
        "or pick a model that has it"
    ]
    assert lines(problems("model=transformer", "data=tokens", "model.d_model=${nope}")) == [
        "model.d_model: follows ${nope}, which names no key of the config; set model.d_model=<value>"
    ]
    # met through the model's vocabulary, which follows the data's: one line, at the key it was met
    (line,) = lines(problems("model=transformer", "data=tokens", "data.vocab_size=${model.nope}"))
    assert line.startswith("model.vocab_size: follows ${model.nope}, but model=transformer has no nope")


def test_manual_needs_exactly_one_of_order_and_params_per_rank():
    assert lines(problems("partitioner=manual", "partitioner.order=null")) == [
        "partitioner.order=null: partitioner=manual needs partitioner.order (ordered name patterns, any world size) "
        "or partitioner.params_per_rank (one list of patterns per rank); set one, e.g. 'partitioner.order=[\"*\"]'"
    ]
    both = ["partitioner=manual", "partitioner.order=[layers.*]", "partitioner.params_per_rank=[[*weight],[*bias]]"]
    assert lines(problems(*both)) == [
        "partitioner.order and partitioner.params_per_rank are both given: partitioner=manual takes one; drop one, "
        "or set it to null (partitioner.order=null)"
    ]
    manual_mlp_and_an_order = ["experiment=manual_mlp", "partitioner.order=[layers.*]"]  # the experiment gave one
    assert "are both given" in problems(*manual_mlp_and_an_order)


def test_a_given_params_per_rank_wins_over_the_presets_default_order():
    """The mission's command: manual.yaml's default ``order`` yields to the ``params_per_rank`` given."""
    cfg, _ = preflight(["partitioner=manual", "partitioner.params_per_rank=[[*weight],[*bias]]"])
    assert cfg.partitioner.order is None and cfg.partitioner.params_per_rank == [["*weight"], ["*bias"]]
    partitioner = instantiate(cfg.partitioner)
    specs = [ParamSpec(numel=4, name=name) for name in ("a.weight", "a.bias", "b.weight", "b.bias")]
    owners = {specs[shard.param].name: shard.rank for shard in partitioner(specs, 2).shards}
    assert owners == {"a.weight": 0, "b.weight": 0, "a.bias": 1, "b.bias": 1}
    assert preflight(["partitioner=manual"])[0].partitioner.order == ["*"]  # given neither: the model's order
    preflight(["experiment=manual_mlp"])


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        (
            "optim=zero_adam partitioner=flat",
            "'optim=zero_adam partitioner=flat': several overrides in one argument; give each as its own argument: "
            "optim=zero_adam partitioner=flat (quote only a value that holds spaces: key='a b')",
        ),
        (
            "optim.lr=[1e-3",
            "'optim.lr=[1e-3': not an override Hydra can parse (",
        ),
    ],
)
def test_an_argument_hydra_cannot_parse_is_named(argument, expected):
    (line,) = lines(problems(argument))
    assert line.startswith(expected), line
    assert "write key=value" in line or "several overrides" in line
