"""Command-line overrides read one way: with Hydra's own parser, as Hydra reads them
(``+dist.world_size=2``, ``~model.x``, ``hydra/launcher=slurm``, sweeps); each distinct string
is parsed once per process (Hydra's parser costs milliseconds).

    [o.key for o in read(["+dist.world_size=2", "~model.x"])]   # ["dist.world_size", "model.x"]
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from hydra.core.override_parser.overrides_parser import OverridesParser

__all__ = ["Override", "given", "read"]


@dataclass(frozen=True)
class Override:
    """One override as Hydra parsed it."""

    key: str  # the key or group, without its +, ++ or ~ (``dist.world_size``, ``hydra/launcher``)
    value: str | None  # as written (``1e-3``, ``'a,b'``, ``adam,zero_adam``); None: a deletion without a value
    text: str  # the override as given

    @property
    def root(self) -> str:
        """The top-level key or group it sets (``dist`` for ``dist.world_size``, ``hydra`` for ``hydra/launcher``)."""
        return self.key.split(".", 1)[0].split("/", 1)[0]


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> Override:
    (parsed,) = OverridesParser.create().parse_overrides([text])
    written = None if parsed.is_delete() and parsed.value() is None else text.split("=", 1)[1]  # a key has no "="
    return Override(parsed.key_or_group, written, text)


def read(overrides: Iterable[str]) -> list[Override]:
    """Each override parsed by Hydra (``OverrideParseException`` for one it cannot read, as on the command line)."""
    return [_parsed(str(text)) for text in overrides]


def given(overrides: Iterable[str], key: str) -> bool:
    """Whether ``overrides`` set ``key`` (``+key=``, ``++key=`` and ``~key`` included)."""
    return any(o.key == key for o in read(overrides))
