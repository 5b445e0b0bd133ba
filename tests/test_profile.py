"""`mlxspec profile`: the step breakdown record, and the side-by-side forward paths."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import pytest
from mlx import nn
from typer.testing import CliRunner

from mlxspec.cli import app
from mlxspec.core.model import COMPILE_MAX_TOKENS, Llama, LlamaConfig
from mlxspec.measure.profile import PATHS, PHASES, compare_paths, sync_round_trip_ms

TINY = LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   intermediate_size=48, rope_theta=10000.0)


def test_compare_paths_times_every_path_and_leaves_the_landed_one_on():
    quantized = Llama(TINY)
    nn.quantize(quantized, group_size=32, bits=4, class_predicate=lambda p, m: p.endswith("q_proj"))
    assert compare_paths(quantized, [1, 2, 3], [1, 2, 3], 1, lambda s: None) is None  # no CPU path
    model = Llama(TINY)
    mx.eval(model.parameters())
    ticks = []
    paths = compare_paths(model, [1, 2, 3, 4, 5], [1, 2, 3], 2, ticks.append)
    assert [p.path for p in paths] == list(PATHS) and len(ticks) == 2
    assert all(len(p.ms) == 3 and all(m > 0 for m in p.ms) for p in paths)
    assert paths[0].vs_plain == [1.0, 1.0, 1.0]
    assert model.use_cpu_path and model.cpu_path().compile_max_tokens == COMPILE_MAX_TOKENS


def test_sync_round_trip_is_a_positive_time():
    """How long a host sync takes depends on the machine and its load, so no test bounds it
    (`mlxspec profile` reports it as the step's sync round trip)."""
    ms = sync_round_trip_ms(5)
    assert isinstance(ms, float) and math.isfinite(ms) and ms > 0


@pytest.mark.model
def test_profile_command_json(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["profile", "-d", "ngram:3", "-k", "2", "--steps", "3", "--warmup", "1",
                                 "--repeats", "1", "--compare", "--backend", "mlx", "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d == json.loads(out.read_text())
    assert d["command"] == "profile" and d["settings"]["k"] == 2 and d["settings"]["draft"] == "ngram:3"
    assert [p["name"] for p in d["phases"]] == list(PHASES)
    assert all(len(p["samples"]) == 3 for p in d["phases"])
    assert [v["tokens"] for v in d["verify"]] == [1, 2, 3] and d["verify"][0]["ratio"] == 1.0
    assert [p["path"] for p in d["paths"]] == list(PATHS)
    assert d["instrumented_step_ms"] == pytest.approx(sum(p["ms"] for p in d["phases"]))
    assert d["eager"] is False and d["sync_ms"] > 0 and 0 < d["python_ms"] < d["instrumented_step_ms"]


@pytest.mark.model
def test_profile_runs_the_step_on_torch_where_generate_would():
    """On torch the step runs eagerly: its parts still sum to the step, but Python is not told
    apart from arithmetic, and there is no lazy graph to sync (both null, said in the table)."""
    pytest.importorskip("torch")
    r = CliRunner().invoke(app, ["profile", "-d", "ngram:3", "-k", "2", "--steps", "3", "--warmup", "1",
                                 "--repeats", "1", "--backend", "torch", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["backend"].startswith("PyTorch") and d["eager"] is True
    assert d["sync_ms"] is None and d["python_ms"] is None and d["paths"] is None
    assert [p["name"] for p in d["phases"]] == list(PHASES) and all(len(p["samples"]) == 3 for p in d["phases"])
    assert [v["tokens"] for v in d["verify"]] == [1, 2, 3] and d["engine_step_ms"] > 0
    table = CliRunner().invoke(app, ["profile", "-d", "ngram:3", "-k", "1", "--steps", "2", "--warmup", "0",
                                     "--repeats", "1", "--backend", "torch"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "target pass: run (Python and arithmetic)" in table.output and "torch runs eagerly" in table.output
    assert "of which Python" not in table.output and "one host sync" not in table.output


@pytest.mark.parametrize("args", [["-d", "none"], ["-k", "0"], ["--steps", "0"], ["--repeats", "0"],
                                  ["--compare", "--backend", "torch"]])
def test_profile_refuses_bad_arguments_before_loading(args, monkeypatch):
    from mlxspec.targets import loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("loaded a model"))
    r = CliRunner().invoke(app, ["profile", *args])
    assert r.exit_code == 2 and "error:" in r.output


def test_default_draft_is_the_registry_default_or_a_shipped_one(monkeypatch):
    from mlxspec.measure.profile import profiled_draft
    from mlxspec.targets import loading, store

    monkeypatch.setattr(loading, "resolve", lambda spec: ("tgt", None))
    shipped = [{"name": "other", "target": "x", "present": True}, {"name": "gone", "target": "tgt", "present": False},
               {"name": "mine", "target": "tgt", "present": True}]
    monkeypatch.setattr(store, "drafts", lambda: shipped)
    monkeypatch.setattr(store, "default_draft", lambda t, backend="mlx": "named")
    assert profiled_draft("default", "m") == "named" and profiled_draft("ngram:2", "m") == "ngram:2"
    monkeypatch.setattr(store, "default_draft", lambda t, backend="mlx": "none")  # target-only is the default
    assert profiled_draft("default", "m") == "mine"
    monkeypatch.setattr(store, "drafts", list)
    assert profiled_draft("default", "m") == "ngram:3"
