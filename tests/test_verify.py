"""Tests for mlxspec.verify: greedy and rejection-sampling acceptance rules."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import mlxspec  # noqa: F401  (must come before mlx: loads the fast BLAS)
from mlxspec.core.verify import (
    expected_accept_rate,
    greedy_verify,
    rejection_output_distribution,
    rejection_verify,
    token_match_rate,
)

MIN_P_VALUE = 1e-3
NUM_SAMPLES = 40_000


# ----------------------------------------------------------------------------- helpers


def one_hot_logits(tokens: list[int], vocab: int) -> mx.array:
    logits = np.zeros((len(tokens), vocab), dtype=np.float32)
    logits[np.arange(len(tokens)), tokens] = 5.0
    return mx.array(logits)


def greedy(draft: list[int], logits: mx.array) -> tuple[int, int]:
    n, tok = greedy_verify(mx.array(draft, dtype=mx.int32), logits)
    assert n.dtype == mx.int32 and tok.dtype == mx.int32
    assert n.shape == () and tok.shape == ()
    return n.item(), tok.item()


def random_dist(rng: np.random.Generator, vocab: int, rows: int | None = None) -> np.ndarray:
    shape = (vocab,) if rows is None else (rows, vocab)
    return rng.dirichlet(np.full(vocab, 0.5), size=rows).astype(np.float32).reshape(shape)


def batched_rejection(
    drafts: np.ndarray, q: np.ndarray | None, p: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Run rejection_verify once per row of ``drafts``, each with its own key, via mx.vmap."""
    keys = mx.random.split(mx.random.key(seed), num=len(drafts))
    p_mx = mx.array(p)
    q_mx = None if q is None else mx.array(q)
    run = mx.vmap(lambda d, k: rejection_verify(d, q_mx, p_mx, k))
    n, tok = run(mx.array(drafts, dtype=mx.int32), keys)
    mx.eval(n, tok)
    return np.array(n), np.array(tok)


def sample_drafts(rng: np.random.Generator, q: np.ndarray, num: int) -> np.ndarray:
    q64 = q.astype(np.float64)
    cols = [rng.choice(q.shape[-1], size=num, p=row / row.sum()) for row in q64]
    return np.stack(cols, axis=1).astype(np.int32)


def assert_matches_distribution(tokens: np.ndarray, p: np.ndarray) -> None:
    """Chi-square fit of ``tokens`` against ``p``; zero-probability tokens must never occur."""
    p64 = p.astype(np.float64) / p.astype(np.float64).sum()
    counts = np.bincount(tokens, minlength=len(p64))
    support = p64 > 0
    assert counts[~support].sum() == 0
    expected = p64[support] * len(tokens)
    assert chisquare(counts[support], expected).pvalue > MIN_P_VALUE


# ----------------------------------------------------------------------------- greedy


def test_greedy_all_accepted_gives_bonus():
    logits = one_hot_logits([3, 1, 4, 2], vocab=6)
    assert greedy([3, 1, 4], logits) == (3, 2)


def test_greedy_first_rejected_gives_correction():
    logits = one_hot_logits([3, 1, 4, 2], vocab=6)
    assert greedy([0, 1, 4], logits) == (0, 3)


def test_greedy_middle_rejection():
    logits = one_hot_logits([3, 1, 4, 2], vocab=6)
    assert greedy([3, 5, 4], logits) == (1, 1)
    assert greedy([3, 1, 0], logits) == (2, 4)


def test_greedy_single_draft_token():
    logits = one_hot_logits([2, 0], vocab=3)
    assert greedy([2], logits) == (1, 0)
    assert greedy([1], logits) == (0, 2)


@settings(max_examples=60, deadline=None)
@given(
    num_draft=st.integers(1, 8),
    vocab=st.integers(2, 50),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_greedy_accepts_exactly_the_matching_prefix(num_draft, vocab, data, seed):
    prefix = data.draw(st.integers(0, num_draft), label="prefix")
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((num_draft + 1, vocab)).astype(np.float32)
    target = logits.argmax(axis=-1)
    draft = rng.integers(0, vocab, size=num_draft)
    draft[:prefix] = target[:prefix]
    if prefix < num_draft:
        draft[prefix] = (target[prefix] + rng.integers(1, vocab)) % vocab
    n, tok = greedy(draft.tolist(), mx.array(logits))
    assert n == prefix
    assert tok == target[prefix]


# ----------------------------------------------------------------------------- exact output law


def _exact_cases(rng: np.random.Generator, vocab: int):
    p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.full(vocab, 0.3))
    yield "random", p, q
    yield "p == q", p, p.copy()
    # Sparse: zero out about half the entries of each, keeping at least one.
    mp, mq = rng.random(vocab) < 0.5, rng.random(vocab) < 0.5
    mp[rng.integers(vocab)] = mq[rng.integers(vocab)] = True
    yield "zeros", p * mp / (p * mp).sum(), q * mq / (q * mq).sum()
    point = np.zeros(vocab)
    point[rng.integers(vocab)] = 1.0
    yield "point-mass q", p, point
    yield "point-mass p", point, q
    yield "both point masses", point, np.roll(point, 1)
    if vocab >= 2:
        split = rng.integers(1, vocab)
        a, b = np.zeros(vocab), np.zeros(vocab)
        a[:split], b[split:] = p[:split], q[split:]
        yield "disjoint supports", a / a.sum(), b / b.sum()


@pytest.mark.parametrize("vocab", [1, 2, 3, 5, 8, 17, 64, 100, 257, 500, 1000])
def test_rejection_output_distribution_equals_target(vocab):
    rng = np.random.default_rng(vocab)
    for _ in range(5):
        for name, p, q in _exact_cases(rng, vocab):
            out = rejection_output_distribution(p, q)
            np.testing.assert_allclose(out, p, rtol=0, atol=1e-12, err_msg=name)


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=40)
)
def test_rejection_output_distribution_property(weights):
    p, q = np.array(weights, dtype=np.float64).T
    p[0] += 1e-3  # keep both normalisable
    q[-1] += 1e-3
    p, q = p / p.sum(), q / q.sum()
    np.testing.assert_allclose(rejection_output_distribution(p, q), p, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- Monte Carlo


def test_monte_carlo_single_draft_token():
    rng = np.random.default_rng(0)
    vocab = 8
    p = random_dist(rng, vocab, rows=2)
    q = random_dist(rng, vocab, rows=1)
    p[0, 5] = 0.0  # one token the target never emits, even if the draft likes it
    p[0] /= p[0].sum()
    q[0, 5] += 0.2
    q[0] /= q[0].sum()
    drafts = sample_drafts(rng, q, NUM_SAMPLES)
    n, tok = batched_rejection(drafts, q, p, seed=1)

    first = np.where(n >= 1, drafts[:, 0], tok)
    assert_matches_distribution(first, p[0])
    # Conditional on acceptance, the bonus token comes from the last row.
    assert_matches_distribution(tok[n == 1], p[1])
    # Acceptance happens with probability sum(min(p, q)).
    alpha = float(expected_accept_rate(p[0].astype(np.float64), q[0].astype(np.float64)))
    accepted = int((n == 1).sum())
    observed = [accepted, NUM_SAMPLES - accepted]
    expected = [alpha * NUM_SAMPLES, (1 - alpha) * NUM_SAMPLES]
    assert chisquare(observed, expected).pvalue > MIN_P_VALUE


def test_monte_carlo_three_draft_tokens_first_emitted():
    rng = np.random.default_rng(2)
    vocab = 8
    p = random_dist(rng, vocab, rows=4)
    q = random_dist(rng, vocab, rows=3)
    drafts = sample_drafts(rng, q, NUM_SAMPLES)
    n, tok = batched_rejection(drafts, q, p, seed=3)
    assert n.min() >= 0 and n.max() <= 3
    first = np.where(n >= 1, drafts[:, 0], tok)
    assert_matches_distribution(first, p[0])


def test_monte_carlo_point_mass_drafter():
    rng = np.random.default_rng(4)
    vocab = 8
    p = random_dist(rng, vocab, rows=2)
    drafts = rng.integers(0, vocab, size=(NUM_SAMPLES, 1)).astype(np.int32)
    n, tok = batched_rejection(drafts, None, p, seed=5)
    first = np.where(n >= 1, drafts[:, 0], tok)
    assert_matches_distribution(first, p[0])
    # A rejected token is never re-emitted as the correction.
    assert not np.any((n == 0) & (tok == drafts[:, 0]))


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("point_mass", [False, True])
def test_p_equal_q_always_accepts(point_mass):
    rng = np.random.default_rng(6)
    vocab, num_draft, num = 16, 4, 500
    if point_mass:
        drafts = rng.integers(0, vocab, size=(num, num_draft)).astype(np.int32)
        # p row i is the point mass on draft[i], so it varies with the sample: run one by one.
        for d in drafts[:20]:
            p = np.zeros((num_draft + 1, vocab), dtype=np.float32)
            p[np.arange(num_draft), d] = 1.0
            p[-1] = random_dist(rng, vocab)
            n, _ = rejection_verify(mx.array(d), None, mx.array(p), mx.random.key(int(d[0])))
            assert n.item() == num_draft
        return
    p = random_dist(rng, vocab, rows=num_draft + 1)
    q = p[:num_draft].copy()
    drafts = sample_drafts(rng, q, num)
    n, _ = batched_rejection(drafts, q, p, seed=7)
    assert np.all(n == num_draft)


@pytest.mark.parametrize("point_mass", [False, True])
def test_zero_target_probability_always_rejects(point_mass):
    rng = np.random.default_rng(8)
    vocab, num_draft, num, bad = 10, 3, 2000, 4
    p = random_dist(rng, vocab, rows=num_draft + 1)
    p[0, bad] = 0.0
    p[0] /= p[0].sum()
    q = None if point_mass else random_dist(rng, vocab, rows=num_draft)
    drafts = rng.integers(0, vocab, size=(num, num_draft)).astype(np.int32)
    drafts[:, 0] = bad
    n, tok = batched_rejection(drafts, q, p, seed=9)
    assert np.all(n == 0)
    assert not np.any(tok == bad)


def test_empty_residual_falls_back_without_nan():
    # Inconsistent inputs (p row sums to 0.5, q(d) > p(d) everywhere): every rejection lands
    # on an all-zero residual. The fallback must still emit a valid token from p's support.
    rng = np.random.default_rng(10)
    vocab, num = 6, 500
    q = random_dist(rng, vocab, rows=1)
    q[0, 0] = 0.0
    q[0] /= q[0].sum()
    p = np.stack([0.5 * q[0], random_dist(rng, vocab)])
    drafts = sample_drafts(rng, q, num)
    n, tok = batched_rejection(drafts, q, p, seed=11)
    rejected = tok[n == 0]
    assert len(rejected) > 0
    assert np.all((rejected >= 0) & (rejected < vocab))
    assert np.all(p[0][rejected] > 0)


def test_near_equal_rows_emit_only_supported_tokens():
    # p and q equal up to float32 rounding: the residual is noise, tokens must stay in support.
    rng = np.random.default_rng(12)
    vocab, num = 32, 2000
    base = rng.dirichlet(np.full(vocab, 0.3))
    base[:4] = 0.0
    base /= base.sum()
    p = np.stack([base, base]).astype(np.float32)
    q = (base * (1 + 1e-6 * rng.standard_normal(vocab)))[None].astype(np.float32)
    q /= q.sum()
    drafts = sample_drafts(rng, q, num)
    n, tok = batched_rejection(drafts, q, p, seed=13)
    emitted = np.where(n >= 1, drafts[:, 0], tok)
    assert np.all(p[0][emitted] > 0)
    assert np.all(p[1][tok] > 0)


def test_same_key_same_output_and_keys_matter():
    rng = np.random.default_rng(14)
    vocab, num_draft = 20, 5
    p = mx.array(random_dist(rng, vocab, rows=num_draft + 1))
    q = mx.array(random_dist(rng, vocab, rows=num_draft))
    draft = mx.array(rng.integers(0, vocab, size=num_draft).astype(np.int32))
    outs = set()
    for seed in range(30):
        a = rejection_verify(draft, q, p, mx.random.key(seed))
        b = rejection_verify(draft, q, p, mx.random.key(seed))
        assert (a[0].item(), a[1].item()) == (b[0].item(), b[1].item())
        outs.add((a[0].item(), a[1].item()))
    assert len(outs) > 1


def test_functions_are_lazy_and_compile():
    # mx.compile traces with placeholder arrays: any .item()/eval inside would raise.
    rng = np.random.default_rng(15)
    vocab, num_draft = 12, 3
    p = mx.array(random_dist(rng, vocab, rows=num_draft + 1))
    q = mx.array(random_dist(rng, vocab, rows=num_draft))
    draft = mx.array(rng.integers(0, vocab, size=num_draft).astype(np.int32))
    logits = mx.array(rng.standard_normal((num_draft + 1, vocab)).astype(np.float32))
    key = mx.random.key(3)

    for fn, args in [
        (greedy_verify, (draft, logits)),
        (rejection_verify, (draft, q, p, key)),
        (lambda d, pp, k: rejection_verify(d, None, pp, k), (draft, p, key)),
    ]:
        eager = fn(*args)
        compiled = mx.compile(fn)(*args)
        assert [x.item() for x in eager] == [x.item() for x in compiled]


# ----------------------------------------------------------------------------- acceptance rates


def test_accept_rate_beats_token_matching():
    rng = np.random.default_rng(16)
    for vocab in [2, 5, 50, 1000]:
        for _ in range(20):
            p, q = rng.dirichlet(np.full(vocab, 0.5)), rng.dirichlet(np.full(vocab, 0.5))
            assert expected_accept_rate(p, q) >= token_match_rate(p, q) - 1e-15
            assert expected_accept_rate(p, p) == pytest.approx(1.0)


def test_accept_rate_equality_cases():
    point = np.eye(5)[2]
    # Same point mass: both rules always accept.
    assert expected_accept_rate(point, point) == token_match_rate(point, point) == 1.0
    # Disjoint supports: both never accept.
    other = np.eye(5)[3]
    assert expected_accept_rate(point, other) == token_match_rate(point, other) == 0.0
    # Uniform p == q: rejection sampling always accepts, token matching only 1/V of the time.
    uniform = np.full(4, 0.25)
    assert expected_accept_rate(uniform, uniform) == pytest.approx(1.0)
    assert token_match_rate(uniform, uniform) == pytest.approx(0.25)


def test_accept_rates_mx_matches_numpy():
    rng = np.random.default_rng(17)
    p, q = random_dist(rng, 30, rows=3), random_dist(rng, 30, rows=3)
    for rate in (expected_accept_rate, token_match_rate):
        from_mx = np.array(rate(mx.array(p), mx.array(q)))
        np.testing.assert_allclose(from_mx, rate(p, q), rtol=1e-5)


# ----------------------------------------------------------------------------- block verification
import itertools  # noqa: E402

from mlxspec.core.verify import (  # noqa: E402
    block_decide,
    block_decide_reference,
    block_stop_probabilities,
    block_verify,
    rejection_decide_reference,
)


def random_conditionals(rng, vocab: int, depth: int, kind: str) -> dict[tuple[int, ...], np.ndarray]:
    """A distribution for every prefix shorter than ``depth``: random, with zeros, or (for q)
    equal to p at some prefixes (``kind``), so the rule's corner cases all occur."""
    out = {}
    for n in range(depth):
        for prefix in itertools.product(range(vocab), repeat=n):
            row = rng.dirichlet(np.full(vocab, 0.7))
            if kind == "zeros" and rng.random() < 0.4:
                row[rng.integers(vocab)] = 0.0
            out[prefix] = row / row.sum()
    return out


def block_exact_joint(p_of, q_of, vocab: int, k: int, rule: str) -> tuple[np.ndarray, float]:
    """The exact distribution of the first K + 1 tokens when one step drafts K from q and
    verifies with ``rule`` (block or token by token), the target sampling the rest; and the
    expected drafts kept."""
    joint, kept = np.zeros((vocab,) * (k + 1)), 0.0
    for chain in itertools.product(range(vocab), repeat=k):
        q_rows = np.array([q_of[chain[:i]] for i in range(k)])
        p_rows = np.array([p_of[chain[:i]] for i in range(k + 1)])
        weight = np.prod([q_rows[i, chain[i]] for i in range(k)])
        if weight == 0:
            continue
        if rule == "block":
            stops = block_stop_probabilities(chain, q_rows, p_rows)
        else:  # token by token: keep i with min(1, p/q) until the first refusal
            keep = [min(1.0, p_rows[i, chain[i]] / q_rows[i, chain[i]]) for i in range(k)]
            stops = np.array([np.prod(keep[:n]) * (1 - keep[n] if n < k else 1) for n in range(k + 1)])
        for n, pn in enumerate(stops):
            if pn == 0:
                continue
            eta = [0.0 if i == n - 1 else 2.0 for i in range(k)]  # forces the stop at n
            if rule == "block":
                got, row = block_decide_reference(chain, q_rows, p_rows, eta)
            else:
                got, row = rejection_decide_reference(chain, q_rows, p_rows, [0.0] * n + [1.0] * (k - n))
            assert got == n
            kept += weight * pn * n
            for y in range(vocab):
                out = chain[:n] + (y,)
                for rest in itertools.product(range(vocab), repeat=k - n):
                    seq = out + rest
                    tail = np.prod([p_of[seq[:j]][seq[j]] for j in range(n + 1, k + 1)]) if rest else 1.0
                    joint[seq] += weight * pn * row[y] * tail
    return joint, kept


@pytest.mark.parametrize("k, kind", [(1, "random"), (2, "random"), (3, "random"), (2, "zeros"), (3, "equal")])
def test_block_verification_is_exact_and_keeps_at_least_as_many_drafts(k, kind):
    vocab, rng = 3, np.random.default_rng(10 * k + len(kind))
    for _ in range(4):
        p_of = random_conditionals(rng, vocab, k + 2, "zeros" if kind == "zeros" else "random")
        q_of = random_conditionals(rng, vocab, k + 1, "random")
        if kind == "equal":  # the drafter is exactly the target at some prefixes
            q_of = {pre: (p_of[pre] if rng.random() < 0.5 else row) for pre, row in q_of.items()}
        target = np.zeros((vocab,) * (k + 1))
        for seq in itertools.product(range(vocab), repeat=k + 1):
            target[seq] = np.prod([p_of[seq[:j]][seq[j]] for j in range(k + 1)])
        block, kept_block = block_exact_joint(p_of, q_of, vocab, k, "block")
        token, kept_token = block_exact_joint(p_of, q_of, vocab, k, "token")
        assert 0.5 * np.abs(block - target).sum() < 1e-12
        assert 0.5 * np.abs(token - target).sum() < 1e-12  # the harness itself, on the known-exact rule
        assert kept_block >= kept_token - 1e-12
        if k == 1:
            assert abs(kept_block - kept_token) < 1e-12  # one draft: the same rule


def test_block_decide_is_its_reference_and_verify_is_lazy_and_seeded():
    rng = np.random.default_rng(3)
    for k in (1, 2, 4, 6):
        for _ in range(20):
            vocab = 7
            q = rng.dirichlet(np.full(vocab, 0.5), size=k).astype(np.float32)
            p = rng.dirichlet(np.full(vocab, 0.5), size=k + 1).astype(np.float32)
            draft = np.array([rng.choice(vocab, p=q[i] / q[i].sum()) for i in range(k)])
            eta = rng.random(k).astype(np.float32)
            n, row = block_decide(mx.array(draft), mx.array(q), mx.array(p), mx.array(eta))
            want_n, want_row = block_decide_reference(draft, q, p, eta)
            assert n.item() == want_n
            np.testing.assert_allclose(np.array(row), want_row, atol=1e-5)
    draft, q, p = mx.array([1, 2]), mx.array(q[:2]), mx.array(p[:3])
    key = mx.random.key(5)
    first = [x.item() for x in block_verify(draft, q, p, key)]
    assert first == [x.item() for x in block_verify(draft, q, p, key)]
