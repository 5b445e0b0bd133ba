"""Distribution equivalence of the whole engine (level b of the design's three levels).

Two tiny random Llamas over a 4-token vocabulary (tests/exact.py) play target and draft. For a fixed prompt the
EXACT joint distribution of the first three tokens the target alone would sample is computed by
enumerating every prefix (1 + 4 + 16 sequences, float64 products of ``sampling.probs``).

The engine's own output distribution is computed exactly too: ``exact.engine_distribution`` runs
the real ``engine.generate`` (real drafter, real target pass, real cache rollback) once per path
through its random choices, with an enumerating source of randomness in place of
``mx.random.categorical`` / ``mx.random.uniform`` (see tests/exact.py), and sums the paths'
probabilities. The two joints must agree to float32 rounding (total variation below 1e-5), where
the former 20,000-sample chi-squared runs could only see deviations of a few hundredths in total
variation. A wrong rejection rule, a wrong residual, a q that is not what the draft was sampled
from, wrong target rows, an off-by-one in the target's cache rollback all shift this distribution;
three power checks below break the verifier or the rollback on purpose and must fail. (A drafter
whose own cache goes wrong only lowers acceptance: the rule is exact for any q it is told
truthfully. test_drafters checks that rollback directly.) A whole configuration takes 20-350 engine runs (a
second or a few) instead of the former 20,000 (1.5-7 minutes).

The vocabulary is small so that enumeration stays cheap: a draft may land in any of the 4 tokens,
and each drafted token within the horizon branches into accept / reject. The models are only mildly
peaked and the draft is an unrelated random model, so a third or more of the judged drafts are
rejected and the accept, reject, bonus and plain paths all carry real probability (each test
asserts it).

The enumeration treats every random draw as independent, so it cannot see the engine reusing a
random key: one test checks that every draw gets a key of its own, and one seeded sampling run
(1,000 samples, chi-squared) checks the real random source end to end.

The end of the file covers level c (``mlxspec.equivalence``, the real-model check behind
``mlxspec verify``): its pure helpers, and the quick mode CI runs, on the real default model.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from exact import (
    EXACT_CFG,
    EXACT_TV,
    EXACT_VOCAB,
    NUM_TOKENS,
    PROMPT,
    EnumerationError,
    engine_distribution,
    exact_joint,
    exact_llama,
    ngram_prompt,
    tv,
)
from scipy.stats import chisquare

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.core import engine
from mlxspec.core import ops as mlx_ops
from mlxspec.core.drafters import ModelDrafter, NgramDrafter
from mlxspec.core.events import Step
from mlxspec.core.model import Llama
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams, probs
from mlxspec.core.verify import rejection_verify
from mlxspec.measure import equivalence

CONTEXT = 64
MIN_EXPECTED = 5.0  # (sampling run) cells expected below this are pooled into one bin
SANITY_SAMPLES = 1_000


# ----------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def target() -> Llama:
    return exact_llama(0)


@pytest.fixture(scope="module")
def draft() -> Llama:
    return exact_llama(1)  # unrelated to the target: rejections are common


# ----------------------------------------------------------------------------- the engine, exactly


def exact_engine(target, drafter, params, k, max_tokens, monkeypatch, prompt=PROMPT):
    """The exact joint of the engine's first NUM_TOKENS tokens (see tests/exact.py)."""
    def run():
        return engine.generate(target, prompt, params, max_tokens, set(), CONTEXT, seed=0, drafter=drafter, k=k)

    return engine_distribution(run, NUM_TOKENS, EXACT_VOCAB, monkeypatch, block=params.block_verify)


def check_config(target, drafter, params, k, max_tokens, monkeypatch, prompt=PROMPT):
    t0 = time.perf_counter()
    e = exact_engine(target, drafter, params, k, max_tokens, monkeypatch, prompt)
    dist = tv(e.joint, exact_joint(target, prompt, params))
    print(f"TV={dist:.1e} runs={e.runs} (dead {e.dead_runs}) acceptance={e.acceptance:.2f} "
          f"steps={ {kind: round(v, 3) for kind, v in e.steps.items()} } {time.perf_counter() - t0:.1f}s")
    assert abs(e.total - 1) < 1e-6, f"the enumeration covers {e.total} of the probability"
    assert 0.1 < e.acceptance < 0.9, f"acceptance {e.acceptance:.2f}: the test would not exercise both paths"
    assert e.steps.get("rejected", 0) > 0.1, "corrections should be drawn often"
    assert dist < EXACT_TV, f"total variation {dist:.2e} between the engine's and the target's joint"
    return e


# ----------------------------------------------------------------------------- reference checks


def test_exact_joint_matches_incremental_decoding(target):
    """The batched enumeration agrees with the cached, token-by-token forward the engine uses."""
    params = SamplingParams(temperature=1.0)
    joint = exact_joint(target, PROMPT, params)
    cache = target.make_cache()
    logits = prefill(target, cache, PROMPT)
    seq, prob = [], 1.0
    for tok in (0, 3, 2):
        prob *= float(probs(logits, params)[tok].item())
        seq.append(tok)
        logits = target(mx.array([[tok]], dtype=mx.int32), cache)[0, -1]
    assert joint[tuple(seq)] == pytest.approx(prob, rel=1e-4)


def test_models_are_far_from_uniform_and_disagree(target, draft):
    params = SamplingParams(temperature=1.0)
    p, q = exact_joint(target, PROMPT, params), exact_joint(draft, PROMPT, params)
    p1, q1 = p.sum(axis=(1, 2)), q.sum(axis=(1, 2))
    entropy = -(p1 * np.log(p1)).sum()
    assert entropy < 0.85 * np.log(EXACT_VOCAB)
    assert 0.2 < np.minimum(p1, q1).sum() < 0.8  # rejections are common, so are acceptances
    assert p.min() > 1e-6  # every sequence is possible: nothing hides in a zero cell


# ----------------------------------------------------------------------------- exact engine distribution

# (K, sampling params, max_tokens). max_tokens = K + 1 lets the first step draft all K tokens
# (only the first 3 are judged, the rest are cut off again by the rollback); max_tokens = 3
# with K >= 3 exercises the engine clipping K.
MODEL_CONFIGS = [
    pytest.param(1, SamplingParams(temperature=1.0), 3, id="K1-T1"),
    pytest.param(2, SamplingParams(temperature=1.0), 3, id="K2-T1"),
    pytest.param(4, SamplingParams(temperature=1.0), 5, id="K4-T1"),
    pytest.param(8, SamplingParams(temperature=1.0), 9, id="K8-T1"),
    pytest.param(4, SamplingParams(temperature=1.0, top_p=0.8), 3, id="K4-topp0.8-clipped"),
    pytest.param(4, SamplingParams(temperature=1.0, top_k=2), 5, id="K4-topk2"),
    pytest.param(4, SamplingParams(temperature=1.0, min_p=0.3), 5, id="K4-minp0.3"),  # the server's min_p
    pytest.param(3, SamplingParams(temperature=0.7), 4, id="K3-T0.7"),
]


@pytest.mark.parametrize("k, params, max_tokens", MODEL_CONFIGS)
def test_engine_distribution_is_exactly_the_targets(target, draft, k, params, max_tokens, monkeypatch):
    e = check_config(target, ModelDrafter(draft, "tiny"), params, k, max_tokens, monkeypatch)
    if k > 1:
        kept = e.steps.get("all kept", 0) + e.steps.get("past the horizon", 0)
        assert kept > 0.05, "some steps should keep every judged draft"


BLOCK_CONFIGS = [
    pytest.param(2, SamplingParams(temperature=1.0, block_verify=True), 3, id="K2-T1"),
    pytest.param(2, SamplingParams(temperature=0.7, top_k=3, block_verify=True), 3, id="K2-T0.7-topk3"),
]


@pytest.mark.parametrize("k, params, max_tokens", BLOCK_CONFIGS)
def test_block_verification_in_the_engine_is_exactly_the_target_and_keeps_more(target, draft, k, params,
                                                                               max_tokens, monkeypatch):
    """Chains judged whole (``block_verify``): the engine's joint is the target's, and at least as
    many drafts are kept as token by token on the same configuration."""
    from dataclasses import replace

    e = check_config(target, ModelDrafter(draft, "tiny"), params, k, max_tokens, monkeypatch)
    token = exact_engine(target, ModelDrafter(draft, "tiny"), replace(params, block_verify=False), k, max_tokens,
                         monkeypatch)
    print(f"kept a step: block {e.accepted:.4f}, token {token.accepted:.4f}")
    assert e.accepted >= token.accepted - 1e-6


def test_engine_with_ngram_drafter_is_exactly_the_targets(target, monkeypatch):
    """Prompt lookup: q is a point mass, so acceptance is p(d) and the residual is p without d."""
    params = SamplingParams(temperature=1.0)
    prompt, p_first = ngram_prompt(target, params)
    assert 0.3 < p_first < 0.7
    e = check_config(target, NgramDrafter(3), params, 4, 5, monkeypatch, prompt=prompt)
    assert e.steps.get("plain", 0) > 0.05, "some steps should find nothing to propose"
    assert e.steps.get("all kept", 0) + e.steps.get("past the horizon", 0) > 0.005


# ----------------------------------------------------------------------------- power: broken engines fail


def point_mass_residual_verify(draft, q, p, key):
    """A subtle bug: on rejection the residual subtracts only the drafted token's q (as if the
    drafter were deterministic), not all of q. Acceptance is unchanged."""
    if q is not None:
        q = q * (mx.arange(q.shape[-1])[None, :] == draft[:, None]).astype(q.dtype)
    return rejection_verify(draft, q, p, key)


def test_the_check_catches_a_wrong_residual(target, draft, monkeypatch):
    monkeypatch.setattr(mlx_ops, "rejection_verify", point_mass_residual_verify)
    params = SamplingParams(temperature=1.0)
    e = exact_engine(target, ModelDrafter(draft, "tiny"), params, 2, 3, monkeypatch)
    dist = tv(e.joint, exact_joint(target, PROMPT, params))
    print(f"TV={dist:.3f} runs={e.runs}")
    assert dist > 1000 * EXACT_TV


def test_the_check_catches_a_wrong_accept_threshold(target, draft, monkeypatch):
    """Accepting with probability min(1, p/q) computed from a draft row off by one."""
    monkeypatch.setattr(mlx_ops, "rejection_verify",
                        lambda d, q, p, key: rejection_verify(d, None if q is None else mx.concatenate([q[1:], q[:1]]), p, key))
    params = SamplingParams(temperature=1.0)
    with pytest.raises(EnumerationError, match="threshold"):
        exact_engine(target, ModelDrafter(draft, "tiny"), params, 2, 3, monkeypatch)


def test_the_check_catches_a_block_rule_with_the_wrong_residual(target, draft, monkeypatch):
    """Block verification that keeps the right number of drafts but then draws from the
    target's row there, not from the weighted residual max(0, w p - q)."""
    from mlxspec.core import verify

    def wrong(draft_, q, p, key):
        eta = mx.random.uniform(shape=(draft_.shape[0],), key=key)
        n, _ = verify.block_decide(draft_, q, p, eta)
        return n, mx.random.categorical(mx.log(mx.take(p, n, axis=0)), key=key).astype(mx.int32)

    monkeypatch.setattr(mlx_ops, "block_verify", wrong)
    params = SamplingParams(temperature=1.0, block_verify=True)
    e = exact_engine(target, ModelDrafter(draft, "tiny"), params, 2, 3, monkeypatch)
    assert tv(e.joint, exact_joint(target, PROMPT, params)) > 1000 * EXACT_TV


def test_the_check_catches_a_rollback_off_by_one(target, draft, monkeypatch):
    """The target's cache rolled back one token short: a refused draft stays in its context."""
    def short_trim(c):
        cls = type(c)
        c.__class__ = type("ShortTrim", (cls,), {"trim": lambda self, n: cls.trim(self, n - 1 if n > 0 else n)})
        return c

    real = target.make_cache
    monkeypatch.setattr(target, "make_cache", lambda: [short_trim(c) for c in real()])
    params = SamplingParams(temperature=1.0)
    e = exact_engine(target, ModelDrafter(draft, "tiny"), params, 2, 3, monkeypatch)
    dist = tv(e.joint, exact_joint(target, PROMPT, params))
    print(f"TV={dist:.3f} runs={e.runs}")
    assert dist > 1000 * EXACT_TV


# ----------------------------------------------------------------------------- the real random source


def sample_engine(model, prompt, params, drafter, k, max_tokens, seeds) -> np.ndarray:
    """Histogram (V**NUM_TOKENS,) of the first NUM_TOKENS tokens of ``engine.generate`` over ``seeds``."""
    cells = np.zeros(EXACT_VOCAB**NUM_TOKENS, dtype=np.int64)
    weights = EXACT_VOCAB ** np.arange(NUM_TOKENS - 1, -1, -1)
    for seed in seeds:
        out = [t for ev in engine.generate(model, prompt, params, max_tokens, set(), CONTEXT, seed=seed,
                                           drafter=drafter, k=k)
               if isinstance(ev, Step) for t in ev.emitted]
        assert len(out) == max_tokens
        cells[int(np.dot(out[:NUM_TOKENS], weights))] += 1
    return cells


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


def test_engine_with_its_real_random_keys_matches_target_distribution(target, draft):
    """1,000 seeded samples, K=4, temperature 1, drawn with the engine's own random source: the
    enumeration's model of that source (independent draws) holds end to end."""
    params = SamplingParams(temperature=1.0)
    observed = sample_engine(target, PROMPT, params, ModelDrafter(draft, "tiny"), 4, 3, range(SANITY_SAMPLES))
    stat, dof, p = chi2_against(observed, exact_joint(target, PROMPT, params))
    assert dof >= 15
    assert p > 1e-3, f"chi2={stat:.1f} dof={dof} p={p:.2e}"


def test_every_random_draw_has_a_key_of_its_own(target, draft, monkeypatch):
    """What the enumeration assumes and cannot see: draws are independent. A key reused between
    drafting and verifying, or across steps, or the global random state, fails here."""
    seen: list[bytes] = []

    def recording(fn):
        def draw(*args, key=None, **kw):
            assert key is not None, f"{fn.__name__} drawn from the global random state"
            seen.append(np.array(key).tobytes())
            return fn(*args, key=key, **kw)

        return draw

    def check(drafter, k, seed):
        seen.clear()
        for _ in engine.generate(target, PROMPT, SamplingParams(temperature=1.0), 16, set(), CONTEXT, seed=seed,
                                 drafter=drafter, k=k):
            pass
        assert len(seen) > 16 and len(set(seen)) == len(seen), f"{drafter.name}: a key was used twice"

    monkeypatch.setattr(mx.random, "categorical", recording(mx.random.categorical))
    monkeypatch.setattr(mx.random, "uniform", recording(mx.random.uniform))
    for drafter, k in ((ModelDrafter(draft, "tiny"), 4), (NgramDrafter(1, min_n=1), 3)):
        for seed in range(5):
            check(drafter, k, seed)
    monkeypatch.setattr(mx.random, "split", lambda key, num=2: mx.stack([key] * num))  # power: keys reused
    with pytest.raises(AssertionError, match="used twice"):
        check(ModelDrafter(draft, "tiny"), 4, 0)


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
    assert equivalence.chi2_stat(table[:1].astype(float), table.sum(0).astype(float))[0] == pytest.approx(chi2)
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
    quick = equivalence.VerifyOptions(lm, QUICK_DRAFT, 4, seed=0, quick=True).checked()
    s = equivalence.sampling_check(quick)
    assert s["target_only"]["tokens"] >= 600 and s["speculative"]["tokens"] >= 600
    assert s["dof"] >= 10, "too few bins for a meaningful test"
    assert 0 < s["speculative"]["acceptance_rate"] < 1
    assert s["passed"], f"chi2={s['chi2']:.1f} dof={s['dof']} p={s['p']:.3g}"
    g = equivalence.greedy_check(quick)
    assert g["summary"]["tokens_compared"] == 3 * 24
    assert g["passed"], g["results"]
    result = json.loads(json.dumps({"sampling": s, "greedy": g}))  # JSON-serialisable
    from rich.console import Console

    buf = io.StringIO()
    equivalence.print_verify(result, Console(file=buf, width=120))
    text = buf.getvalue()
    assert "chi2 =" in text and f"dof = {s['dof']}" in text and "verify: PASS" in text


def tiny_eagle(target: Llama, vocab_ids: list[int]):
    """An eagle head on the tiny target with random weights, over a subset of the vocabulary:
    the token outside it has q = 0, which verification must handle exactly."""
    from mlxspec.core.drafters.eagle import EagleConfig, EagleDrafter, EagleHead

    mx.random.seed(2)
    cfg = EagleConfig(hidden_size=EXACT_CFG.hidden_size, intermediate_size=EXACT_CFG.intermediate_size,
                      num_heads=EXACT_CFG.num_heads, num_kv_heads=EXACT_CFG.num_kv_heads, head_vocab=len(vocab_ids),
                      target_vocab=EXACT_VOCAB)
    head = EagleHead(cfg, mx.array(vocab_ids), target.model.embed_tokens)
    head.lm_head.weight = head.lm_head.weight * 3.0
    mx.eval(head.parameters())
    return EagleDrafter(head, "eagle")


@pytest.mark.parametrize("k, params, max_tokens", [
    pytest.param(2, SamplingParams(temperature=1.0), 3, id="K2-T1"),
    pytest.param(4, SamplingParams(temperature=0.7), 5, id="K4-T0.7"),
    # the head draws within its own columns: the filters there must give the q it reports
    pytest.param(2, SamplingParams(temperature=1.0, top_k=2, min_p=0.2), 3, id="K2-T1-topk-minp"),
    pytest.param(2, SamplingParams(temperature=0.8, top_p=0.7), 3, id="K2-T0.8-topp"),
])
def test_engine_with_an_eagle_head_is_exactly_the_targets(target, k, params, max_tokens, monkeypatch):
    e = check_config(target, tiny_eagle(target, [0, 1, 3]), params, k, max_tokens, monkeypatch)
    assert e.steps.get("all kept", 0) + e.steps.get("past the horizon", 0) > 0.01
