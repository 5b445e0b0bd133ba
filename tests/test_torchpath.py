"""The PyTorch path (``mlxspec/torchpath``): the torch llama module against ours, its cache, the
engine driving it (exact distribution, greedy agreement with MLX on the real model, the same
events), and the refusals. The rules in ``torchpath/verify.py`` have tests/test_torch_verify.py."""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache as MlxKVCache

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from exact import (  # noqa: E402
    EXACT_TV,
    EXACT_VOCAB,
    NUM_TOKENS,
    PROMPT,
    EnumerationError,
    exact_joint,
    exact_llama,
    ngram_prompt,
    sampled_tree_chi_square,
    torch_engine_distribution,
    tv,
)
from typer.testing import CliRunner  # noqa: E402

from mlxspec.cli import app  # noqa: E402
from mlxspec.core import engine  # noqa: E402
from mlxspec.core.cache import keep_rows as mlx_keep_rows  # noqa: E402
from mlxspec.core.drafters import ModelDrafter, NgramDrafter  # noqa: E402
from mlxspec.core.events import Done, Step  # noqa: E402
from mlxspec.core.model import Llama, LlamaConfig  # noqa: E402
from mlxspec.core.sampling import SamplingParams  # noqa: E402
from mlxspec.core.tree import parse_tree, verify_mask, verify_positions  # noqa: E402
from mlxspec.errors import MlxspecError  # noqa: E402
from mlxspec.torchpath import ops as torch_ops  # noqa: E402
from mlxspec.torchpath import verify as torch_verify  # noqa: E402
from mlxspec.torchpath.cache import KVCache, keep_rows  # noqa: E402
from mlxspec.torchpath.model import Llama as TorchLlama  # noqa: E402
from tiny import TWIN_BASE, TWIN_FAMILIES  # noqa: E402

runner = CliRunner()

BASE = TWIN_BASE
FAMILIES = {
    **TWIN_FAMILIES,
    "llama3-rope": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "linear-rope": dict(rope_scaling={"type": "linear", "factor": 2.0}),
}


def twins(seed: int = 0, **family) -> tuple[Llama, TorchLlama]:
    mx.random.seed(seed)
    m = Llama(LlamaConfig(**{**BASE, **family}))
    mx.eval(m.parameters())
    return m, TorchLlama.from_mlx(m)


def rel_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(a).max())


# ----------------------------------------------------------------------------- the module


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_ours_prefill_and_cached_steps(family):
    m, t = twins(**FAMILIES[family])
    ids = [(7 * i + 3) % 48 for i in range(40)]
    assert rel_diff(m(mx.array([ids]), None), t(torch.tensor([ids]), None)) < 1e-5
    mc, tc = m.make_cache(), t.make_cache()
    m(mx.array([ids[:30]]), mc), t(torch.tensor([ids[:30]]), tc)
    for i in range(30, 40):  # one token at a time through the caches
        a = m(mx.array([[ids[i]]]), mc)
        b = t(torch.tensor([[ids[i]]]), tc)
        assert rel_diff(a, b) < 1e-5


def test_tree_nodes_equal_their_paths_run_as_chains():
    """Each node sees the context and its ancestors only, at its depth's position."""
    _, t = twins(1)
    context = [5, 9, 2, 7, 11]
    parents = (-1, -1, 0, 0, 1, 2)
    nodes = [3, 4, 8, 1, 6, 10]
    cache = t.make_cache()
    t(torch.tensor([context[:-1]]), cache)
    offset = len(context) - 1
    out = t(torch.tensor([[context[-1]] + nodes]), cache, mask=verify_mask(parents, offset),
            positions=torch.from_numpy(verify_positions(parents, offset)))[0]
    for i in range(len(nodes)):
        path, j = [], i
        while j >= 0:
            path.insert(0, nodes[j])
            j = parents[j]
        chain = t(torch.tensor([context + path]), None)[0, -1]
        assert rel_diff(chain, out[i + 1]) < 1e-5


def test_families_it_does_not_implement_are_refused_in_one_line():
    m = Llama(LlamaConfig(**BASE, gemma=True, model_type="gemma2"))
    with pytest.raises(MlxspecError, match="llama-type blocks.*--backend mlx"):
        TorchLlama.from_mlx(m)


# ----------------------------------------------------------------------------- the cache


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_cache_rollback_and_compaction_match_a_list_and_mlx(data):
    """Appends, trims and tree compactions in any order leave exactly the kept rows, as MLX's
    cache does under the same operations."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    mx_cache = MlxKVCache()
    ours, theirs = [KVCache()], [mx_cache]
    rows: list[np.ndarray] = []
    for _ in range(data.draw(st.integers(1, 8))):
        n = data.draw(st.integers(1, 300))  # crosses the 256-position growth step
        kv = rng.standard_normal((1, 2, n, 4)).astype(np.float32)
        ours[0].update_and_fetch(torch.from_numpy(kv), torch.from_numpy(kv + 1))
        mx_cache.update_and_fetch(mx.array(kv), mx.array(kv + 1))
        start = len(rows)
        rows += list(kv[0, :, :, :].transpose(1, 0, 2))
        op = data.draw(st.sampled_from(["trim", "keep", "none"]))
        if op == "trim":
            drop = data.draw(st.integers(0, n))
            ours[0].trim(drop), mx_cache.trim(drop)
            rows = rows[: len(rows) - drop]
        elif op == "keep":
            kept = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
            keep_rows(ours, start, kept), mlx_keep_rows(theirs, start, kept)
            rows = rows[:start] + [rows[start + r] for r in kept]
        k, v = ours[0].state
        want = np.stack(rows, axis=1)[None] if rows else np.zeros((1, 2, 0, 4), np.float32)
        assert ours[0].offset == mx_cache.offset == len(rows)
        np.testing.assert_array_equal(k.numpy(), want)
        np.testing.assert_array_equal(v.numpy(), want + 1)
        if rows:
            np.testing.assert_array_equal(np.array(mx_cache.keys[..., : mx_cache.offset, :]), want)


# ----------------------------------------------------------------------------- batched generation


def mlx_greedy(m: Llama, prompt: list[int], n: int, stop: set[int]) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = int(mx.argmax(m(mx.array([seq]), None)[0, -1]).item())
        if t in stop:
            break
        out.append(t)
        seq.append(t)
    return out


@pytest.mark.parametrize("invariant", [False, True])
def test_batched_greedy_is_each_prompts_own_decoding(invariant):
    """Left padding and masked pad keys: every row of a batch of mixed lengths decodes as MLX
    decodes it alone, and stops before its stop token; also on the batch-invariant kernels a
    loaded target runs on (``--target-written``'s answers are generated so)."""
    from mlxspec.torchpath.generate import generate
    from mlxspec.torchpath.invariant import make_batch_invariant

    m, t = twins(4)
    assert not invariant or make_batch_invariant(t)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, BASE["vocab_size"], n).tolist() for n in (1, 9, 4, 23)]
    free = generate(t, prompts, 12, 0.0, 0, stop=[])
    assert free == [mlx_greedy(m, p, 12, set()) for p in prompts]
    stop = {free[2][3]}  # a token row 2 emits at its fourth step
    stopped = generate(t, prompts, 12, 0.0, 0, stop=sorted(stop))
    assert stopped == [mlx_greedy(m, p, 12, stop) for p in prompts] and len(stopped[2]) <= 3


def test_batched_sampling_draws_each_rows_own_distribution():
    """At T = 0.7 the first token of each row, over 3,000 rows of two prompts of different
    lengths in one batch, follows that prompt's own softmax (chi-square), and a seed repeats."""
    from scipy.stats import chisquare

    from mlxspec.torchpath.generate import generate

    m, t = twins(5)
    short, long = [3, 7], [5, 1, 8, 2, 9, 4, 4, 6, 11, 2]
    rows = [short, long] * 1500
    first = np.array([c[0] for c in generate(t, rows, 1, 0.7, 3, stop=[])])
    for k, p in enumerate((short, long)):
        probs = np.array(mx.softmax(m(mx.array([p]), None)[0, -1].astype(mx.float32) / 0.7), np.float64)
        probs /= probs.sum()
        counts = np.bincount(first[k::2], minlength=len(probs))
        keep = probs * 1500 >= 5  # pool the rare tokens so every expected count is >= 5
        f_obs = np.append(counts[keep], counts[~keep].sum())
        f_exp = np.append(probs[keep], probs[~keep].sum()) * 1500
        assert chisquare(f_obs, f_exp).pvalue > 1e-3
    again = np.array([c[0] for c in generate(t, rows[:40], 1, 0.7, 3, stop=[])])
    assert (again == first[:40]).all()


# ----------------------------------------------------------------------------- exact distribution (L2)


@pytest.fixture(scope="module")
def pair():
    """The 4-token target and unrelated draft of tests/exact.py (test_equivalence's), on both backends."""
    target, draft = exact_llama(0), exact_llama(1)
    return target, TorchLlama.from_mlx(target), TorchLlama.from_mlx(draft)


def torch_exact(torch_target, drafter, params, k, max_tokens, monkeypatch, prompt=PROMPT):
    def run():
        return engine.generate(torch_target, prompt, params, max_tokens, set(), 64, seed=0, drafter=drafter, k=k)

    return torch_engine_distribution(run, NUM_TOKENS, EXACT_VOCAB, monkeypatch, block=params.block_verify)


@pytest.mark.parametrize("k, params, max_tokens", [
    pytest.param(1, SamplingParams(temperature=1.0), 3, id="K1-T1"),
    pytest.param(2, SamplingParams(temperature=1.0, block_verify=True), 3, id="K2-T1-block"),
    pytest.param(4, SamplingParams(temperature=1.0), 5, id="K4-T1"),
    pytest.param(3, SamplingParams(temperature=0.7), 4, id="K3-T0.7"),
    pytest.param(4, SamplingParams(temperature=1.0, top_k=2), 5, id="K4-topk2"),
])
def test_torch_engine_distribution_is_exactly_the_targets(pair, k, params, max_tokens, monkeypatch):
    mlx_target, torch_target, torch_draft = pair
    e = torch_exact(torch_target, ModelDrafter(torch_draft, "tiny"), params, k, max_tokens, monkeypatch)
    assert abs(e.total - 1) < 1e-6
    assert 0.1 < e.acceptance < 0.9 and e.steps.get("rejected", 0) > 0.1
    assert tv(e.joint, exact_joint(mlx_target, PROMPT, params)) < EXACT_TV


def test_torch_engine_with_ngram_is_exactly_the_targets(pair, monkeypatch):
    mlx_target, torch_target, _ = pair
    params = SamplingParams(temperature=1.0)
    prompt, _ = ngram_prompt(mlx_target, params)
    e = torch_exact(torch_target, NgramDrafter(3, ops=torch_ops), params, 4, 5, monkeypatch, prompt=prompt)
    assert tv(e.joint, exact_joint(mlx_target, prompt, params)) < EXACT_TV


def test_the_torch_check_catches_a_wrong_threshold(pair, monkeypatch):
    """Power: a torch rule judging each draft by the next row's q fails the enumeration."""
    _, torch_target, torch_draft = pair
    real = torch_verify.rejection_decide
    monkeypatch.setattr(torch_verify, "rejection_decide",
                        lambda d, q, p, u: real(d, None if q is None else torch.roll(q, 1, 0), p, u))
    with pytest.raises(EnumerationError, match="threshold"):
        torch_exact(torch_target, ModelDrafter(torch_draft, "tiny"), SamplingParams(temperature=1.0), 2, 3,
                    monkeypatch)


# ----------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def both():
    from mlxspec.targets.loading import load

    return load("default"), load("default", "float32", backend="torch:cpu")  # the float32 twin of MLX's


HELD_OUT = ["Explain in two sentences why the moon has phases.",
            "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
            "Translate to French: The library opens at nine and closes at six."]


@pytest.mark.model
def test_real_model_logits_match_mlx_to_1e4(both):
    lm, tm = both
    for text in HELD_OUT:
        ids = lm.tokenizer.encode(text)
        a = np.array(lm.model(mx.array([ids]), None)[0])
        b = tm.model(torch.tensor([ids]), None)[0].numpy()
        per_row = np.abs(a - b).max(axis=-1) / np.abs(a).max(axis=-1)
        assert per_row.max() < 1e-4


def _events(lm, drafter, ids, k, n=12):
    out = []
    for ev in engine.generate(lm.model, ids, SamplingParams(), n, set(), lm.context_length, drafter=drafter, k=k):
        if isinstance(ev, Step):
            out += [(t.id, t.status.name) for t in ev.tokens]
        assert not isinstance(ev, Done) or ev.generated_tokens == n
    return out


@pytest.mark.model
@pytest.mark.parametrize("spec", ["none", "ngram:3", "self:8", "smollm2-135m-draft", "smollm2-135m-eagle",
                                  "ngram:3+smollm2-135m-eagle"])
def test_real_model_greedy_is_mlx_target_only_for_every_k_and_same_events(both, spec, monkeypatch):
    """Greedy on torch, any drafter and K = 1..8, emits MLX's target-only tokens; at K = 4, with
    the draft's products in float32 as on MLX, every token's status (accepted, rejected,
    corrected, bonus) is the same on both backends."""
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.torchpath import load as torch_load

    lm, tm = both
    ids = lm.tokenizer.encode(HELD_OUT[1])
    reference = [t for t, _ in _events(lm, None, ids, 1)]
    drafter = make_drafter(spec, tm)  # a cascade: made part by part for torch
    assert drafter is None or drafter.name == spec
    for k in range(1, 9) if drafter is not None else [1]:
        got = _events(tm, drafter, ids, k)
        assert [t for t, s in got if s != "REJECTED"] == reference, f"K={k}"
    if drafter is not None:  # by default a draft's products run in bfloat16 or 4 bits (torch_load.draft_dtype, head_bits)
        monkeypatch.setattr(torch_load, "draft_dtype", lambda: torch.float32)
        monkeypatch.setattr(torch_load, "head_bits", lambda: None)  # and a head's not rounded to 4 bits
        assert _events(tm, make_drafter(spec, tm), ids, 4) == _events(lm, make_drafter(spec, lm), ids, 4)
        monkeypatch.undo()
    if spec in ("smollm2-135m-draft", "smollm2-135m-eagle"):  # trees: masks, positions, compaction on torch
        for tree in (parse_tree("2x2"), parse_tree("auto", 6)):
            got = []
            for ev in engine.generate(tm.model, ids, SamplingParams(), 12, set(), tm.context_length,
                                      drafter=drafter, tree=tree):
                got += ev.emitted if isinstance(ev, Step) else []
            assert got == reference, str(tree)


# ----------------------------------------------------------------------------- bad input


def test_backend_torch_without_torch_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    result = runner.invoke(app, ["generate", "hi", "--backend", "torch", "-n", "2"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --backend torch needs PyTorch, which is not installed: pip install 'mlxspec[torch]' "
        "(or `make setup`, which installs it)"]


@pytest.mark.parametrize("args, says", [
    (["--backend", "torch", "--device", "cuda"], "device 'cuda' is not available here"),
    (["--backend", "torch", "--device", "tpu"], "unknown device 'tpu'"),
    (["--backend", "jax"], "unknown backend 'jax'"),
    (["--backend", "mlx", "--device", "cpu"], "--device chooses a torch device"),
])
def test_bad_backend_or_device_is_one_line(args, says):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = runner.invoke(app, ["generate", "hi", "-n", "2", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]
    if "cuda" in args:
        assert "available: cpu" in lines[0]


def test_torch_sampled_tree_speculation_samples_the_target_by_chi_square():
    """``--tree 2x2:sample`` on torch: the drafter's sampled children and torch's multi-round
    rule, as tests/test_tree.py checks them on MLX."""
    target, draft = (TorchLlama.from_mlx(exact_llama(s)) for s in (0, 1))
    pvalue, steps = sampled_tree_chi_square(target, ModelDrafter(draft, "draft"), runs=2000)
    assert pvalue > 1e-3 and any(s.tree.path and s.tree.path[0] == 1 for s in steps)


def test_teacher_pass_on_torch_equals_mlx():
    """The eagle feature build (``training.features.teacher_pass``) gives the same features,
    log-normalisers and argmax on torch as on MLX, padding included."""
    from mlxspec.training.features import teacher_pass

    m, t = twins(3)
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, BASE["vocab_size"], n)) for n in (5, 17, 11)]
    for (h, lse, am), (th, tlse, tam) in zip(teacher_pass(m, seqs), teacher_pass(t, seqs)):
        assert h.dtype == th.dtype == np.float16 and h.shape == th.shape
        assert rel_diff(h, th) < 2e-3 and rel_diff(lse, tlse) < 1e-5 and (am == tam).all()


def test_train_draft_backend_is_for_eagle_features_only(tmp_path):
    result = runner.invoke(app, ["train-draft", "--arch", "draft", "--backend", "torch", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--arch draft trains and distils on MLX" in lines[0]


# ----------------------------------------------------------------------------- other devices


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU and torch with CUDA")
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-3), ("bfloat16", 5e-2)])
def test_cuda_logits_and_greedy_match_mlx(both, dtype, tol):
    """The CUDA parity check: logits within ``tol`` of MLX on the CPU (TF32 / bfloat16 matmuls),
    and greedy speculation still the target's own output on CUDA."""
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.loading import load

    lm, _ = both
    cm = load("default", dtype, backend="torch:cuda")
    ids = lm.tokenizer.encode(HELD_OUT[0])
    a = np.array(lm.model(mx.array([ids]), None)[0])
    b = cm.model(torch.tensor([ids]), None)[0].float().cpu().numpy()
    assert rel_diff(a, b) < tol
    plain = _events(cm, None, ids, 1)
    for spec in ("ngram:3", "smollm2-135m-eagle"):
        got = _events(cm, make_drafter(spec, cm), ids, 4)
        assert [t for t, s in got if s != "REJECTED"] == [t for t, _ in plain]


@pytest.mark.mps
@pytest.mark.skipif(sys.platform != "darwin" or not torch.backends.mps.is_available(), reason="needs Apple silicon")
def test_mps_greedy_is_target_only(both):
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.loading import load

    lm, _ = both
    pm = load("default", "float32", backend="torch:mps")
    ids = lm.tokenizer.encode(HELD_OUT[0])
    plain = [t for t, _ in _events(pm, None, ids, 1)]
    got = _events(pm, make_drafter("smollm2-135m-eagle", pm), ids, 4)
    assert [t for t, s in got if s != "REJECTED"] == plain


def test_backend_auto_is_torch_on_a_linux_cpu_where_it_runs_the_model(monkeypatch):
    import importlib.util

    from tiny import tiny_target

    from mlxspec import torchpath
    from mlxspec.torchpath import backend_spec, prefer_torch

    assert backend_spec("auto", None) == "auto" and backend_spec("auto", "cpu") == "torch:cpu"
    model = tiny_target().model
    monkeypatch.setattr(torchpath.sys, "platform", "linux")
    assert prefer_torch(model, "auto") and prefer_torch(model, "float32")
    assert not prefer_torch(model, "float16")  # half precision on a CPU: MLX's
    assert not prefer_torch(object(), "auto")  # a model only mlx-lm's class runs
    assert not prefer_torch(type("MlxLmTarget", (), {"cfg": object()})(), "auto")
    monkeypatch.setattr(torchpath.sys, "platform", "darwin")
    assert not prefer_torch(model, "auto")  # Apple silicon: MLX on the GPU
    monkeypatch.setattr(torchpath.sys, "platform", "linux")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else object())
    assert not prefer_torch(model, "auto")  # torch not installed


@pytest.mark.model
def test_the_cli_decodes_on_torch_by_default_here_with_the_same_greedy_text():
    import json

    from typer.testing import CliRunner

    from mlxspec.cli import app

    rows = {}
    for backend in ("auto", "mlx"):
        r = CliRunner().invoke(app, ["generate", "What is the capital of France?", "-n", "12", "--json",
                                     "--draft", "none", "--backend", backend, "-t", "0"])
        assert r.exit_code == 0, r.output
        rows[backend] = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows["auto"][-1]["backend"] == "torch:cpu" and rows["mlx"][-1]["backend"] == "mlx"
    text = {b: "".join(t["text"] for t in rs if "status" in t) for b, rs in rows.items()}
    assert text["auto"] == text["mlx"] == "The capital of France is Paris."


def test_a_linux_cpu_without_the_torch_extra_hears_what_it_costs(monkeypatch):
    import importlib.util

    import mlxspec.torchpath as tp

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setattr(sys, "platform", "linux")
    assert "pip install 'mlxspec[torch]'" in tp.missing_torch_hint() and "a third" in tp.missing_torch_hint()
    monkeypatch.setattr(sys, "platform", "darwin")  # MLX on the GPU there: nothing to say
    assert tp.missing_torch_hint() is None
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr(sys, "platform", "linux")
    assert tp.missing_torch_hint() is None
