"""Overrides read one way, by Hydra's own parser (zero_lab.app.config.overrides): the key without
its +, ++ or ~, the value as written, a sweep's choices as written, and Hydra's refusal of what
it cannot read."""

from __future__ import annotations

import pytest
from hydra.errors import OverrideParseException

from zero_lab.app.config.overrides import Override, given, read


def test_keys_and_values_as_hydra_reads_them():
    lines = [
        "+dist.world_size=2",
        "~model.x",
        "++x.y=[1,2]",
        "hydra/launcher=slurm",
        "key='a,b'",
        "optim=adam,zero_adam",
    ]
    assert [(o.key, o.value, o.root) for o in read(lines)] == [
        ("dist.world_size", "2", "dist"),
        ("model.x", None, "model"),
        ("x.y", "[1,2]", "x"),
        ("hydra/launcher", "slurm", "hydra"),
        ("key", "'a,b'", "key"),
        ("optim", "adam,zero_adam", "optim"),
    ]
    assert read(["optim.lr=1e-3"]) == [Override("optim.lr", "1e-3", "optim.lr=1e-3")]  # as written, not 0.001
    assert given(["+dist.world_size=4"], "dist.world_size") and not given(["dist.world_size_x=4"], "dist.world_size")


def test_what_hydra_cannot_read_is_hydras_error():
    with pytest.raises(OverrideParseException):
        read(["a=b=c"])
