"""Time of one Hydra composition, two comparisons, in one process, interleaved round by round:

- ``speed-ups`` against ``hydra alone``: zero_lab/app/config/compose_cache.py installed, and
  Hydra's own behaviour (:func:`~zero_lab.app.config.compose_cache.hydra_alone`);
- ``shipped YAMLs`` against ``YAMLs naming their schema``: the shipped configs, and a copy of them
  in which every option YAML with a ``_target_`` names its schema again
  (``- /schema/<group>@_here_: <name>``, as 18 of them did before), so it is merged twice.

Each round composes ``--per-round`` times in each of the four ways, in turn; the medians of the
rounds' means are printed with their ratios.

    python scripts/compose_time.py --rounds 8 --per-round 10 [overrides ...]   # default: optim=adam
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hydra.core.config_store import ConfigStore

from zero_lab.app.check.preflight import compose_job
from zero_lab.app.config.compose_cache import hydra_alone
from zero_lab.app.config.paths import CONF_DIR
from zero_lab.app.config.schema import GROUPS, register_configs


def naming_their_schema(target: Path) -> Path:
    """A copy of the shipped configs in ``target`` whose option YAMLs name their schema again
    (each that has one stored: :func:`~zero_lab.app.config.schema.register_configs`)."""
    shutil.copytree(CONF_DIR, target)
    stored = ConfigStore.instance().repo["schema"]
    for group in GROUPS:
        for path in (target / group).glob("*.yaml"):
            text = path.read_text()
            if f"{path.stem}.yaml" in stored.get(group, {}) and "defaults:" not in text:
                path.write_text(f"defaults:\n  - /schema/{group}@_here_: {path.stem}\n{text}")
    return target


def mean_seconds(compose: Callable[[], object], times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        compose()
    return (time.perf_counter() - started) / times


def alone(overrides: list[str]) -> object:
    with hydra_alone():
        return compose_job(overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("overrides", nargs="*", default=["optim=adam"])
    args = parser.parse_args()
    register_configs()
    with tempfile.TemporaryDirectory() as scratch:
        named = naming_their_schema(Path(scratch) / "conf")
        ways: dict[str, Callable[[], object]] = {
            "speed-ups": lambda: compose_job(args.overrides),
            "hydra alone": lambda: alone(args.overrides),
            "shipped YAMLs": lambda: compose_job(args.overrides),
            "YAMLs naming their schema": lambda: compose_job(args.overrides, config_dir=named),
        }
        for compose in ways.values():
            compose()  # warm-up: imports, Hydra's plugin scan, the first parses
        means: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, compose in ways.items():
                means[name].append(mean_seconds(compose, args.per_round))
    median = {name: statistics.median(values) for name, values in means.items()}
    for name, values in means.items():
        spread = f"min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f}"
        print(f"{name:27s} median {median[name] * 1e3:6.1f} ms  ({spread})")
    print(f"speed-ups / hydra alone:       {median['speed-ups'] / median['hydra alone']:.2f}")
    print(f"shipped / naming their schema: {median['shipped YAMLs'] / median['YAMLs naming their schema']:.2f}")


if __name__ == "__main__":
    main()
