"""What makes the composition speed-ups safe (app/config/compose_cache.py) holds, and a composition
reads the same config with them and with Hydra's own behaviour: the ConfigStore shared, not
deep-copied; each config file's YAML parse reused while its text is unchanged; an interpolation
map built only for a config whose defaults interpolate."""

from __future__ import annotations

import copy
import os

import hydra
import pytest
from hydra._internal import defaults_list
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from zero_lab.app.check.preflight import compose_job
from zero_lab.app.config import compose_cache
from zero_lab.app.config.compose_cache import file_config_source, hydra_alone, speed_up_compositions
from zero_lab.app.config.schema import register_configs

register_configs()

OVERRIDES = ["optim=adamw", "model=transformer", "data=tokens", "steps=7"]


def test_a_copy_of_the_store_is_the_store_and_a_load_is_a_copy():
    speed_up_compositions()
    speed_up_compositions()  # idempotent
    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store
    loaded = store.load("config_schema.yaml")
    loaded.node.steps = 12345  # a load hands out a copy: changing it leaves the store alone
    assert store.load("config_schema.yaml").node.steps != 12345


@pytest.mark.parametrize("overrides", [OVERRIDES, ["experiment=tutorial", "optim=adam"]])
def test_a_composition_reads_the_same_with_and_without_the_speed_ups(monkeypatch, overrides):
    compose_job(overrides)
    hits = compose_cache._parse.cache_info().hits
    maps_built = []
    hydras_map = compose_cache._HYDRAS[defaults_list]
    monkeypatch.setitem(compose_cache._HYDRAS, defaults_list, lambda *a: maps_built.append(1) or hydras_map(*a))
    fast = compose_job(overrides)
    assert compose_cache._parse.cache_info().hits >= hits + 8  # config.yaml and each of its 7 group options
    assert len(maps_built) == 1  # config.yaml's, whose defaults interpolate ${optim}, ...; of 20-odd configs

    with hydra_alone():  # a deep copy of the store per composition, a parse per file, a map per config
        assert copy.deepcopy(ConfigStore.instance()) is not ConfigStore.instance()
        hydras = compose_job(overrides)
    assert copy.deepcopy(ConfigStore.instance()) is ConfigStore.instance()  # back on leaving
    assert OmegaConf.to_yaml(fast[0]) == OmegaConf.to_yaml(hydras[0])
    assert OmegaConf.to_yaml(fast[2]) == OmegaConf.to_yaml(hydras[2])  # the hydra node too
    assert fast[1] == hydras[1]
    assert fast[1]["optim"] == hydras[1]["optim"] == next(o for o in overrides if o.startswith("optim="))[6:]


def test_a_file_load_is_hydras_and_a_fresh_config_each_time(tmp_path):
    (tmp_path / "job.yaml").write_text("# @package _global_\nlr: 0.5\nlayers: [1, 2]\n")
    source = file_config_source()(provider="test", path=str(tmp_path))
    first = source.load_config("job")
    with hydra_alone():
        assert first == source.load_config("job")  # config, path, provider and header alike
    assert first.header["package"] == "_global_"
    first.config.layers.append(3)  # a caller changes what it got ...
    first.header["package"] = "changed"
    again = source.load_config("job")
    assert again.config.layers == [1, 2] and again.header["package"] == "_global_"  # ... and the next load is whole


def test_an_edited_file_is_read_again_even_at_the_same_size_and_time(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("lr: 0.5\n")
    source = file_config_source()(provider="test", path=str(tmp_path))
    assert source.load_config("job").config.lr == 0.5
    stat = path.stat()
    path.write_text("lr: 0.7\n")  # same size; the mtime set back to the first write's
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert source.load_config("job").config.lr == 0.7


def test_on_another_hydra_only_the_store_is_shared(monkeypatch):
    monkeypatch.setattr(hydra, "__version__", "1.4.0")
    with hydra_alone():
        speed_up_compositions()
        assert file_config_source().load_config is not compose_cache._load_config_file
        assert defaults_list._create_interpolation_map is not compose_cache._interpolation_map_if_read
        assert copy.deepcopy(ConfigStore.instance()) is ConfigStore.instance()
