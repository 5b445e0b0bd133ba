"""``mlxspec parity`` (issue 10): the MLX and torch backends on the same held-out prompts. A tiny
run meets the goals with real, non-zero differences; a perturbed torch weight fails them at the
layer it touches (the check has power); the JSON shape; the CLI's exit codes and its one-line
refusals."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from typer.testing import CliRunner

from mlxspec.cli import app
from mlxspec.measure import parity as pa

runner = CliRunner()
TINY = {"prompts": 1, "drafters": ["none", "smollm2-135m-eagle"], "ks": [1, 4], "max_tokens": 16, "draws": 40,
        "with_speed": False, "threads": 1}
PERTURBED_LAYER = 5


@pytest.fixture(scope="module")
def tl():
    """The default model on torch (CPU, float32), its MLX source beside it."""
    from mlxspec.targets import store
    from mlxspec.targets.loading import load

    if not store.entry(store.default_target()).present:
        pytest.fail("default model missing: run `make setup` (or `mlxspec models pull`) first")
    return load("default", "float32", backend="torch:cpu")


@pytest.fixture(scope="module")
def tiny(tl):
    return pa.run_parity(pa.ParityOptions(tl, "cpu", **TINY))


@pytest.fixture(scope="module")
def perturbed(tl):
    """A run with one torch weight scaled (restored afterwards): the power check."""
    w = tl.model.layers[PERTURBED_LAYER].mlp.down_proj.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(1.5)
        return pa.run_parity(pa.ParityOptions(tl, "cpu", **{**TINY, "drafters": ["none"], "ks": [1], "draws": 10}))
    finally:
        with torch.no_grad():
            w.copy_(saved)


# ----------------------------------------------------------------------------- no model


def test_relative_difference_is_per_row_over_the_largest_magnitude():
    s = pa.DiffSum("x")
    s.add(np.array([[10.0, -1.0], [0.5, 0.25]]), np.array([[10.0, -1.5], [0.5, 0.2]]))
    d = s.diff()
    assert d.max_rel == pytest.approx(0.1)  # row 2: 0.05 / 0.5
    assert d.mean_rel == pytest.approx((0 + 0.05 + 0 + 0.1) / 4)
    assert d.max_abs == pytest.approx(0.5) and d.elements == 4


def test_prompts_take_one_category_after_another():
    items, note = pa.parity_prompts(7)
    assert len(items) == 7
    if note is None:  # Spec-Bench is here: the first six are one of each category
        assert len({it["category"] for it in items[:6]}) == 6
        assert items[6]["category"] == items[0]["category"]


# ----------------------------------------------------------------------------- the real model


@pytest.mark.model
def test_tiny_run_meets_the_goals_with_real_differences(tiny, tl):
    assert tiny.passed, tiny.goals.missed()
    names = [d.name for d in tiny.layers]
    assert names == ["embed", *(f"layer {i}" for i in range(tl.config.num_layers)), "norm", "head",
                     "logits (cached pass)"]
    head = {d.name: d for d in tiny.layers}
    for name in ("head", "logits (cached pass)"):
        assert 0 < head[name].max_rel <= pa.TOLERANCE["float32"]  # two backends do round differently
        assert head[name].mean_rel <= head[name].max_rel
    assert [g.label for g in tiny.greedy] == ["target-only", "smollm2-135m-eagle K=1", "smollm2-135m-eagle K=4"]
    for g in tiny.greedy:
        assert g.identical == g.prompts == 1 and g.tokens_agreeing == g.tokens_compared == 16
    # The head drafts in 4 bits on torch's VNNI kernel and in float32 on MLX: where its own top two
    # nearly tie, the two may draft apart (and keep different counts), never write apart.
    assert tiny.greedy[0].same_steps == 1
    assert all(g.tau_mlx > 0 and g.tau_torch > 0 for g in tiny.greedy[1:])
    (d,) = tiny.decisions
    assert d.k == 4 and d.agree == d.draws == 40 and d.unexplained == 0
    assert 0 < d.mean_accepted < 4  # the draws both keep and reject: the decisions are not trivial
    assert d.keep_max_abs < 1e-3 and d.residual_max_abs < 1e-3


@pytest.mark.model
def test_a_perturbed_torch_weight_fails_at_its_layer(perturbed):
    layers = {d.name: d for d in perturbed.layers}
    tol = pa.TOLERANCE["float32"]
    assert all(layers[f"layer {i}"].max_rel < tol for i in range(PERTURBED_LAYER))
    assert layers[f"layer {PERTURBED_LAYER}"].max_rel > 10 * tol
    assert layers["head"].max_rel > 10 * tol and not perturbed.goals.logits
    (g,) = perturbed.greedy
    assert g.mismatches == 1 and not g.divergences[0].near_tie
    assert not perturbed.goals.greedy and not perturbed.passed
    missed = " ".join(perturbed.goals.missed())
    assert "logits" in missed and "greedy" in missed


@pytest.mark.model
def test_json_shape(tiny):
    out = json.loads(json.dumps(tiny.to_json()))
    assert out["check"] == "parity" and out["passed"] is True and out["missed"] == []
    assert out["relative"] == pa.RELATIVE and out["tolerance"] == pa.TOLERANCE["float32"]
    assert out["torch"]["device"] == "cpu" and out["torch"]["dtype"] == "float32"
    assert out["header"]["model"] and out["header"]["dtype"] == "float32"
    assert set(out["settings"]) >= {"prompts", "drafters", "ks", "max_tokens", "decision_draws"}
    assert set(out["layers"][0]) == {"name", "max_rel", "mean_rel", "max_abs", "elements"}
    assert {g["label"] for g in out["greedy"]} == {"target-only", "smollm2-135m-eagle K=1", "smollm2-135m-eagle K=4"}
    assert set(out["decisions"][0]) >= {"agree", "explained", "unexplained", "residual_max_abs"}
    assert out["speed"] is None and set(out["goals"]) >= {"logits", "greedy", "decisions"}


@pytest.mark.model
def test_speed_side_by_side(tl):
    ids = tl.tokenizer.encode("The capital of France is")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sp = pa.speed(tl.source, tl, ids, "p", max_tokens=4, repeats=1)
    finally:
        torch.set_num_threads(before)
    assert sp.mlx.decode_tps_median > 0 and sp.torch.decode_tps_median > 0 and sp.ratio > 0
    assert sp.mlx.runs == sp.torch.runs == 1 and sp.max_tokens == 4


@pytest.mark.model
def test_default_drafters_of_the_default_model(tl):
    assert pa.default_drafters(tl.source) == ["none", "ngram:3", "self:8", "smollm2-135m-draft", "smollm2-135m-eagle",
                                              "smollm2-135m-eagle3"]


# ----------------------------------------------------------------------------- the CLI


@pytest.mark.model
def test_cli_exit_code_follows_the_goals(monkeypatch, tiny, perturbed):
    calls = []
    monkeypatch.setattr(pa, "run_parity", lambda options, progress: calls.append(options) or tiny)
    r = runner.invoke(app, ["parity", "--quick", "--json", "--draft", "none, ngram:3"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["passed"] is True
    (o,) = calls
    assert (o.model, o.device, o.dtype, o.prompts, o.drafters, o.ks) == (
        "default", "cpu", "auto", pa.QUICK["prompts"], ["none", "ngram:3"], list(pa.QUICK["ks"]))
    assert o.draws == pa.QUICK["draws"] and o.repeats == pa.QUICK["repeats"] and o.threads is None
    monkeypatch.setattr(pa, "run_parity", lambda options, progress: perturbed)
    r = runner.invoke(app, ["parity", "--quick"])
    assert r.exit_code == 1
    assert "parity: missed goal(s): logits" in r.output and "greedy" in r.output


@pytest.mark.parametrize("args, says", [
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--device", "mps"], "device 'mps' is not available here"),
    (["--device", "cuda"], "device 'cuda' is not available here"),
    (["--dtype", "float64"], "--dtype float64 is not available on the torch backend"),
    (["--dtype", "quantized"], "--dtype quantized runs the file's 4-bit weights with bfloat16 products"),
    (["--k", "0"], "K must be in 1..64"),
    (["--prompts", "0"], "--prompts, --max-tokens and --draws must be >= 1"),
    (["--draft", "none,,ngram:3"], "bad --draft 'none,,ngram:3'"),
])
def test_cli_bad_input_is_one_line(args, says):
    if "cuda" in args and torch.cuda.is_available() or "mps" in args and sys.platform == "darwin":
        pytest.skip("this machine has the device")
    r = runner.invoke(app, ["parity", *args])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], r.output


def test_cli_without_torch_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    r = runner.invoke(app, ["parity"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        ("error: --backend torch needs PyTorch, which is not installed: pip install 'mlxspec[torch]' "
         "(or `make setup`, which installs it)")]


# ----------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU and torch with CUDA")
def test_cuda_parity_float32():
    """The CUDA parity run, float32: the same goals as on the CPU."""
    r = pa.run_parity(pa.ParityOptions("default", "cuda", "float32", **{
        **TINY, "drafters": ["none", "ngram:3", "smollm2-135m-eagle"], "threads": None}))
    assert r.torch.device == "cuda" and r.passed, r.goals.missed()
