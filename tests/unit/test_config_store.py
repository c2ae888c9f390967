"""Hydra's ConfigStore is shared, not deep-copied, by each composition (schema.share_the_config_store):
what makes that safe holds, and a composition reads the same config either way."""

from __future__ import annotations

import copy

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from zero_lab.app.check.preflight import compose_job
from zero_lab.app.config.schema import register_configs, share_the_config_store

register_configs()


def test_a_copy_of_the_store_is_the_store_and_a_load_is_a_copy():
    share_the_config_store()
    share_the_config_store()  # idempotent
    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store
    loaded = store.load("config_schema.yaml")
    loaded.node.steps = 12345  # a load hands out a copy: changing it leaves the store alone
    assert store.load("config_schema.yaml").node.steps != 12345


def test_a_composition_reads_the_same_with_the_store_copied_or_shared(monkeypatch):
    shared = compose_job(["optim=adamw", "model=transformer", "data=tokens", "steps=7"])
    monkeypatch.delattr(ConfigStore, "__deepcopy__")  # Hydra's own behaviour: a deep copy per composition
    assert copy.deepcopy(ConfigStore.instance()) is not ConfigStore.instance()
    copied = compose_job(["optim=adamw", "model=transformer", "data=tokens", "steps=7"])
    assert OmegaConf.to_yaml(shared[0]) == OmegaConf.to_yaml(copied[0])
    assert shared[1] == copied[1]
    assert shared[0].steps == 7 and shared[1]["optim"] == "adamw"
