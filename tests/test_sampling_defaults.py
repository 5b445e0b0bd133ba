"""A model's recommended chat sampling (``targets/sampling_defaults.py``): the registry's for a
shipped model, a folder's ``generation_config.json`` otherwise, else greedy."""

from __future__ import annotations

import json

from mlxspec.targets import store
from mlxspec.targets.sampling_defaults import SamplingDefaults, from_generation_config, sampling_defaults


def test_the_default_model_has_its_chosen_settings_with_their_source():
    d = sampling_defaults("default")
    assert (d.params.temperature, d.params.top_p, d.params.top_k, d.params.min_p) == (1.0, 1.0, 0, 0.1)
    assert "chat-defaults.md" in d.source and d == sampling_defaults(store.default_target())
    assert d.label == "T=1 min-p=0.1"


def test_a_folder_follows_its_generation_config(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert sampling_defaults(str(folder)) == SamplingDefaults()  # no generation_config.json: greedy
    cfg = folder / "generation_config.json"
    cfg.write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "bos_token_id": 1}))
    d = sampling_defaults(str(folder))
    # a missing top_k is transformers' default (50), as the authors' settings run there
    assert (d.params.temperature, d.params.top_p, d.params.top_k, d.params.min_p) == (0.6, 0.95, 50, 0.0)
    assert d.source == "the model's generation_config.json"
    cfg.write_text(json.dumps({"do_sample": True, "temperature": 0.7, "top_k": 20, "min_p": 0.05}))
    assert from_generation_config(cfg).label == "T=0.7 top-k=20 min-p=0.05"


def test_greedy_where_the_model_says_so_or_nothing_readable():
    assert sampling_defaults("no/such-model-anywhere") == SamplingDefaults()


def test_a_config_that_does_not_sample_or_cannot_be_read_is_greedy(tmp_path):
    cfg = tmp_path / "generation_config.json"
    cfg.write_text(json.dumps({"temperature": 0.6}))  # transformers samples only with do_sample
    assert from_generation_config(cfg).params.temperature == 0.0
    for text in ("not json", "[1, 2]", json.dumps({"do_sample": True, "temperature": "hot"})):
        cfg.write_text(text)
        assert from_generation_config(cfg).params.temperature == 0.0
    assert from_generation_config(tmp_path / "missing.json") == SamplingDefaults()
