"""Distribution equivalence of the whole engine (level b of the design's three levels).

Two tiny random Llamas over a 16-token vocabulary play target and draft. For a fixed prompt the
EXACT joint distribution of the first three tokens the target alone would sample is computed by
enumerating every prefix (1 + 16 + 256 sequences, float64 products of ``sampling.probs``). Then
``engine.generate`` runs speculative decoding once per seed, and a chi-squared goodness-of-fit
test compares the histogram of its first three tokens (4,096 cells, those expected below 5 pooled
into one bin) with that joint. A wrong rejection rule, a wrong residual, an off-by-one in the
cache rollback or in the drafter's pending tokens all shift this distribution.

The models are made peaked (an untied LM head scaled by 4: the first token has ~1.5 nats of
entropy, not 2.8) so 20,000 samples fill most of the probability mass with well-populated cells,
and the draft is a 50/50 blend of the target with an unrelated model, so that about 60% of the
drafted tokens are rejected and the accept, reject and bonus paths are all exercised.

Runs are seeded (seed i for the i-th sample), so every test is deterministic on a given machine.
The long runs are ``slow`` (20,000 samples, 1.5-7 minutes each on a shared 2-core CPU; about 28
minutes for all eight); one small sanity run and one power check (a deliberately broken
verifier must fail) are in the fast suite.

The end of the file covers level c (``mlxspec.equivalence``, the real-model check behind
``mlxspec verify``): its pure helpers, and the quick mode CI runs, on the real default model.
"""

from __future__ import annotations

import io
import itertools
import json
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map
from scipy.stats import chisquare

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.core import engine
from mlxspec.core.drafters import ModelDrafter, NgramDrafter
from mlxspec.core.events import Step
from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.core.sampling import SamplingParams, probs
from mlxspec.core.verify import rejection_verify
from mlxspec.measure import equivalence

VOCAB = 16
CFG = LlamaConfig(
    vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
    tie_embeddings=False,
)
OUT_SCALE = 4.0  # LM head x4: peaked, far from uniform
DRAFT_BLEND = 0.5  # draft = (1 - b) * target + b * unrelated model
PROMPT = [1, 2, 3]
NUM_TOKENS = 3  # the joint distribution of this many first tokens is tested
CONTEXT = 64
MIN_EXPECTED = 5.0  # cells expected below this are pooled into one bin
MIN_P_VALUE = 0.01
SLOW_SAMPLES = 20_000


# ----------------------------------------------------------------------------- models


def tiny_llama(seed: int) -> Llama:
    mx.random.seed(seed)
    m = Llama(CFG)
    m.lm_head.weight = m.lm_head.weight * OUT_SCALE
    mx.eval(m.parameters())
    return m


@pytest.fixture(scope="module")
def target() -> Llama:
    return tiny_llama(0)


@pytest.fixture(scope="module")
def draft(target) -> Llama:
    other = tiny_llama(1)
    other.update(tree_map(lambda t, o: (1 - DRAFT_BLEND) * t + DRAFT_BLEND * o, target.parameters(), other.parameters()))
    mx.eval(other.parameters())
    return other


# ----------------------------------------------------------------------------- exact reference


def next_token_probs(model: Llama, sequences: list[list[int]], params: SamplingParams) -> np.ndarray:
    """float64 (len(sequences), V): the processed next-token distribution after each sequence,
    from one batched forward pass of equal-length sequences."""
    logits = model(mx.array(sequences, dtype=mx.int32), model.make_cache())[:, -1]
    p = np.array(probs(logits, params), dtype=np.float64)
    return p / p.sum(axis=-1, keepdims=True)


def exact_joint(model: Llama, prompt: list[int], params: SamplingParams, n: int = NUM_TOKENS) -> np.ndarray:
    """P(first n sampled tokens = (t_1..t_n)) under target-only sampling, shape (V,) * n.

    Enumerates every prefix: 1, V, V^2, ... sequences, one batch per length."""
    joint = np.ones(())
    for depth in range(n):
        prefixes = [prompt + list(t) for t in itertools.product(range(VOCAB), repeat=depth)]
        cond = next_token_probs(model, prefixes, params).reshape((VOCAB,) * depth + (VOCAB,))
        joint = joint[..., None] * cond
    assert abs(joint.sum() - 1) < 1e-9
    return joint


# ----------------------------------------------------------------------------- sampling the engine


def sample_engine(model, prompt, params, drafter, k, max_tokens, seeds) -> tuple[np.ndarray, dict]:
    """Histogram (V**NUM_TOKENS,) of the first NUM_TOKENS tokens of ``engine.generate`` over
    ``seeds``, and acceptance counts {drafted, accepted, steps, full}."""
    cells = np.zeros(VOCAB**NUM_TOKENS, dtype=np.int64)
    stats = dict(drafted=0, accepted=0, steps=0, full=0)
    weights = VOCAB ** np.arange(NUM_TOKENS - 1, -1, -1)
    for seed in seeds:
        out: list[int] = []
        for ev in engine.generate(model, prompt, params, max_tokens, set(), CONTEXT, seed=seed, drafter=drafter, k=k):
            if isinstance(ev, Step):
                out += ev.emitted
                if ev.k:
                    stats["steps"] += 1
                    stats["drafted"] += ev.k
                    stats["accepted"] += ev.accepted
                    stats["full"] += ev.accepted == ev.k
        assert len(out) == max_tokens
        cells[int(np.dot(out[:NUM_TOKENS], weights))] += 1
    return cells, stats


def chi2_against(observed: np.ndarray, joint: np.ndarray, min_expected: float = MIN_EXPECTED):
    """Goodness of fit of ``observed`` counts to the exact ``joint``: cells expected below
    ``min_expected`` are pooled into one bin (merged into the smallest kept cell if the pool
    itself is expected below it). Returns (chi2, dof, p)."""
    p = joint.ravel()
    n = observed.sum()
    impossible = observed[p == 0].sum()
    assert impossible == 0, f"{impossible} samples fell on sequences the target gives probability 0"
    expected = p * n
    keep = expected >= min_expected
    obs = list(observed[keep])
    exp = list(expected[keep])
    pool_obs, pool_exp = observed[~keep].sum(), expected[~keep].sum()
    if pool_exp >= min_expected or not exp:
        obs.append(pool_obs)
        exp.append(pool_exp)
    else:
        i = int(np.argmin(exp))
        obs[i] += pool_obs
        exp[i] += pool_exp
    obs, exp = np.array(obs, dtype=np.float64), np.array(exp)
    exp *= n / exp.sum()  # exact totals for scipy
    stat, pval = chisquare(obs, exp)
    return float(stat), len(obs) - 1, float(pval)


def run_config(target, drafter, params, k, max_tokens, num, prompt=PROMPT, seed0=0):
    joint = exact_joint(target, prompt, params)
    observed, stats = sample_engine(target, prompt, params, drafter, k, max_tokens, range(seed0, seed0 + num))
    stat, dof, p = chi2_against(observed, joint)
    return stat, dof, p, stats


# ----------------------------------------------------------------------------- reference checks


def test_exact_joint_matches_incremental_decoding(target):
    """The batched enumeration agrees with the cached, token-by-token forward the engine uses."""
    params = SamplingParams(temperature=1.0)
    joint = exact_joint(target, PROMPT, params)
    cache = target.make_cache()
    logits = engine.prefill(target, cache, PROMPT)
    seq, prob = [], 1.0
    for tok in (4, 10, 7):
        prob *= float(probs(logits, params)[tok].item())
        seq.append(tok)
        logits = target(mx.array([[tok]], dtype=mx.int32), cache)[0, -1]
    assert joint[tuple(seq)] == pytest.approx(prob, rel=1e-4)


def test_models_are_peaked_and_disagree(target, draft):
    params = SamplingParams(temperature=1.0)
    p, q = exact_joint(target, PROMPT, params), exact_joint(draft, PROMPT, params)
    p1, q1 = p.sum(axis=(1, 2)), q.sum(axis=(1, 2))
    entropy = -(p1 * np.log(p1)).sum()
    assert entropy < 0.75 * np.log(VOCAB)  # far from uniform
    assert 0.2 < np.minimum(p1, q1).sum() < 0.8  # rejections are common, so are acceptances
    assert p[p * SLOW_SAMPLES >= MIN_EXPECTED].sum() > 0.9  # the binned cells carry most mass


# ----------------------------------------------------------------------------- fast suite


def test_engine_matches_target_distribution_small(target, draft):
    """2,000 samples, K=4, temperature 1: a quick sanity run with a looser threshold."""
    params = SamplingParams(temperature=1.0)
    stat, dof, p, stats = run_config(target, ModelDrafter(draft, "tiny"), params, k=4, max_tokens=3, num=2_000)
    assert 0.1 < stats["accepted"] / stats["drafted"] < 0.9
    assert p > 1e-3, f"chi2={stat:.1f} dof={dof} p={p:.2e}"


def biased_verify(draft, q, p, key):
    """A classic bug: on rejection sample the correction from p instead of norm(max(0, p - q))."""
    n, _ = rejection_verify(draft, q, p, key)
    row = mx.take(p.astype(mx.float32), n, axis=0)
    return n, mx.random.categorical(mx.log(row), key=mx.random.split(key, 3)[2]).astype(mx.int32)


def test_the_check_catches_a_wrong_residual(target, draft, monkeypatch):
    """Power: the same check on a subtly broken verifier fails decisively."""
    monkeypatch.setattr(engine, "rejection_verify", biased_verify)
    params = SamplingParams(temperature=1.0)
    stat, dof, p, _ = run_config(target, ModelDrafter(draft, "tiny"), params, k=4, max_tokens=3, num=1_000)
    assert p < 1e-6, f"chi2={stat:.1f} dof={dof} p={p:.2e}"


# ----------------------------------------------------------------------------- slow suite

# (K, sampling params, max_tokens). max_tokens = K + 1 lets the first step draft all K tokens
# (only the first 3 are judged); max_tokens = 3 with K >= 3 exercises the engine clipping K.
MODEL_CONFIGS = [
    pytest.param(1, SamplingParams(temperature=1.0), 3, id="K1-T1"),
    pytest.param(2, SamplingParams(temperature=1.0), 3, id="K2-T1"),
    pytest.param(4, SamplingParams(temperature=1.0), 5, id="K4-T1"),
    pytest.param(8, SamplingParams(temperature=1.0), 9, id="K8-T1"),
    pytest.param(4, SamplingParams(temperature=1.0, top_p=0.8), 3, id="K4-topp0.8-clipped"),
    pytest.param(4, SamplingParams(temperature=1.0, top_k=5), 5, id="K4-topk5"),
    pytest.param(3, SamplingParams(temperature=0.7), 4, id="K3-T0.7"),
]


@pytest.mark.slow
@pytest.mark.parametrize("k, params, max_tokens", MODEL_CONFIGS)
def test_engine_matches_target_distribution(target, draft, k, params, max_tokens):
    stat, dof, p, stats = run_config(
        target, ModelDrafter(draft, "tiny"), params, k=k, max_tokens=max_tokens, num=SLOW_SAMPLES, seed0=10_000 * k
    )
    rate = stats["accepted"] / stats["drafted"]
    assert 0.1 < rate < 0.9, f"acceptance {rate:.2f}: the test would not exercise both paths"
    if k > 1:
        assert stats["full"] > 0.02 * stats["steps"], "some steps should accept all K drafts"
    print(f"chi2={stat:.1f} dof={dof} p={p:.3f} acceptance={rate:.2f} full={stats['full'] / stats['steps']:.2f}")
    assert p > MIN_P_VALUE, f"chi2={stat:.1f} dof={dof} p={p:.2e} acceptance={rate:.2f}"


def ngram_prompt(target, params) -> tuple[list[int], float]:
    """A prompt [a, b, c, a, b] after which prompt lookup proposes c, ..., chosen so the target's
    probability of c is nearest 1/2 (accepted and rejected alike)."""
    cands = [(a, b, c) for a, b, c in itertools.permutations(range(1, VOCAB), 3)]
    p = next_token_probs(target, [[a, b, c, a, b] for a, b, c in cands], params)
    pc = p[np.arange(len(cands)), [c for _, _, c in cands]]
    i = int(np.argmin(np.abs(pc - 0.5)))
    a, b, c = cands[i]
    return [a, b, c, a, b], float(pc[i])


@pytest.mark.slow
def test_engine_with_ngram_drafter_matches_target_distribution(target):
    """Prompt lookup: q is a point mass, so acceptance is p(d) and the residual is p without d."""
    params = SamplingParams(temperature=1.0)
    prompt, p_first = ngram_prompt(target, params)
    assert 0.3 < p_first < 0.7
    stat, dof, p, stats = run_config(target, NgramDrafter(3), params, k=4, max_tokens=5, num=SLOW_SAMPLES, prompt=prompt)
    rate = stats["accepted"] / stats["drafted"]
    assert 0.1 < rate < 0.9, f"acceptance {rate:.2f}"
    print(f"chi2={stat:.1f} dof={dof} p={p:.3f} acceptance={rate:.2f} full={stats['full'] / stats['steps']:.2f}")
    assert p > MIN_P_VALUE, f"chi2={stat:.1f} dof={dof} p={p:.2e} acceptance={rate:.2f}"


# ----------------------------------------------------------------------------- real model (level c)


QUICK_DRAFT = "ngram:3"  # self:6 accepts ~2% at T=1 here and runs 3x slower than target-only


def test_contingency_bins_are_adaptive():
    plain = Counter({5: 30, 6: 12, 7: 4, 8: 1})
    spec = Counter({5: 28, 6: 9, 7: 5, 9: 2})
    ids, table = equivalence.contingency_bins(plain, spec, max_bins=200, min_count=10)
    assert ids == [5, 6]  # 7 (9 pooled) and the rest fall below 10 pooled counts
    assert table.tolist() == [[30, 12, 5], [28, 9, 7]]
    ids, table = equivalence.contingency_bins(plain, spec, max_bins=1, min_count=10)
    assert ids == [5] and table.tolist() == [[30, 17], [28, 16]]
    ids, table = equivalence.contingency_bins(Counter({1: 20}), Counter({1: 15}))
    assert ids == [1] and table.tolist() == [[20], [15]]  # empty "other" column dropped


def test_permutation_statistic_matches_scipy_and_is_calibrated():
    from scipy.stats import chi2_contingency

    rng = np.random.default_rng(0)
    # 20 rounds, 6 bins; sequences are "clustered": each draws its own bin preferences.
    def seqs():
        return np.stack([rng.multinomial(30, rng.dirichlet(np.full(6, 0.7))) for _ in range(20)])

    a, b = seqs(), seqs()
    table = np.stack([a.sum(0), b.sum(0)])
    chi2 = chi2_contingency(table, correction=False)[0]
    assert equivalence._chi2_stat(table[:1].astype(float), table.sum(0).astype(float))[0] == pytest.approx(chi2)
    assert equivalence.permutation_p(a, a.copy(), 0.0, permutations=200) == 1.0
    # Under the null the permutation p-value is not small, while the asymptotic one often is.
    perm = [equivalence.permutation_p(x, y, chi2_contingency(np.stack([x.sum(0), y.sum(0)]), correction=False)[0],
                                      permutations=400, seed=i)
            for i, (x, y) in enumerate((seqs(), seqs()) for _ in range(40))]
    assert np.mean(np.array(perm) < 0.05) <= 0.15
    # A real difference is found.
    shifted = b.copy()
    shifted[:, 0] += 15
    obs = chi2_contingency(np.stack([a.sum(0), shifted.sum(0)]), correction=False)[0]
    assert equivalence.permutation_p(a, shifted, obs, permutations=2000) < 0.01


def test_verify_prompts_interleave_categories():
    items = equivalence.verify_prompts()
    assert len(items) >= 3 and all(it["text"] for it in items)
    cats = [it["category"] for it in items]
    first = cats[: len(set(cats))]
    assert len(set(first)) == len(first)  # one of each category before any repeats


@pytest.mark.model
def test_quick_verify_passes(lm):
    """What `mlxspec verify --quick` runs in CI: both checks pass on the real model."""
    s = equivalence.sampling_check(lm, draft=QUICK_DRAFT, k=4, seed=0, **equivalence.QUICK_SAMPLING)
    assert s["target_only"]["tokens"] >= 600 and s["speculative"]["tokens"] >= 600
    assert s["dof"] >= 10, "too few bins for a meaningful test"
    assert 0 < s["speculative"]["acceptance_rate"] < 1
    assert s["passed"], f"chi2={s['chi2']:.1f} dof={s['dof']} p={s['p']:.3g}"
    g = equivalence.greedy_check(lm, draft=QUICK_DRAFT, k=4, **equivalence.QUICK_GREEDY)
    assert g["summary"]["tokens_compared"] == 3 * 24
    assert g["passed"], g["results"]
    result = json.loads(json.dumps({"sampling": s, "greedy": g}))  # JSON-serialisable
    from rich.console import Console

    buf = io.StringIO()
    equivalence.print_verify(result, Console(file=buf, width=120))
    text = buf.getvalue()
    assert "chi2 =" in text and f"dof = {s['dof']}" in text and "verify: PASS" in text
