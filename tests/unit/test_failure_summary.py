"""A rank failure is summarised by its cause: the exception's own message, first line — not
Hydra's ``full_key`` trailer, not the last line of a multi-line message."""

from __future__ import annotations

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from zero_lab.runtime.spawn import cause_line


def refuse_to_build(size: int) -> None:
    """A model constructor that fails as an allocation of ``size`` bytes would."""
    raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {size} bytes.")


def test_a_hydra_build_failure_is_summarised_by_the_error_it_wraps():
    with pytest.raises(InstantiationException) as caught:
        instantiate({"_target_": f"{__name__}.refuse_to_build", "size": 40_000_000_000})
    assert "full_key" in str(caught.value) or "refuse_to_build" in str(caught.value)
    assert cause_line(caught.value) == (
        "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 40000000000 bytes."
    )


def test_a_multi_line_message_is_summarised_by_its_first_line():
    ddp_like = RuntimeError(
        "Expected to have finished reduction in the prior iteration before starting a new one. "
        "This error indicates that your module has parameters that were not used in producing loss.\n"
        "Parameter indices which did not receive grad for rank 0: 2 3\n"
        " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL"
    )
    assert cause_line(ddp_like).startswith("RuntimeError: Expected to have finished reduction in the prior iteration")
    assert cause_line(ddp_like).endswith("not used in producing loss.")
    assert cause_line(KeyError("extra")) == "KeyError: 'extra'"
    assert cause_line(SystemExit()) == "SystemExit"
