"""The PyTorch path's sampling and acceptance rules (issue 10) against the MLX ones and the
float64 references: greedy and tree rules give MLX's answers; the rejection decision equals
``rejection_decide_reference`` given the same uniforms; integrating that decision over u gives
exactly p; the filters keep the same tokens as mlx-lm's."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch path is optional: install with pip install 'mlxspec[torch]'")

import mlx.core as mx
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)
from mlxspec.core import sampling as mlx_sampling
from mlxspec.core import verify as mlx_verify
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.verify import rejection_decide_reference
from mlxspec.torchpath import sampling as torch_sampling
from mlxspec.torchpath import verify as torch_verify

torch.set_num_threads(1)

TOP_U = float(np.nextafter(1.0, 0.0))  # the largest uniform in [0, 1)
BISECTIONS = 48


@st.composite
def trees(draw, max_nodes: int = 10) -> tuple[int, ...]:
    """Any tree: every node's parent is an earlier node or the root."""
    m = draw(st.integers(0, max_nodes))
    return tuple(draw(st.integers(-1, i - 1)) for i in range(m))


def ints(x) -> tuple[int, ...]:
    return tuple(int(v.item()) for v in x)


def torch_decide(draft, q, p, u) -> tuple[int, np.ndarray]:
    to = lambda a: None if a is None else torch.from_numpy(np.asarray(a))
    n, row = torch_verify.rejection_decide(torch.from_numpy(np.asarray(draft)), to(q), to(p), to(u))
    assert n.dtype == torch.int32 and n.shape == ()
    return int(n), row.numpy()


def mlx_decide(draft, q, p, u) -> tuple[int, np.ndarray]:
    n, row = mlx_verify.rejection_decide(
        mx.array(draft), None if q is None else mx.array(q), mx.array(p), mx.array(u)
    )
    return int(n.item()), np.array(row)


# ----------------------------------------------------------------------------- greedy and trees


@settings(max_examples=60, deadline=None)
@given(num_draft=st.integers(0, 8), vocab=st.integers(2, 40), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_greedy_verify_equals_mlx(num_draft, vocab, data, seed):
    prefix = data.draw(st.integers(0, num_draft), label="prefix")
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((num_draft + 1, vocab)).astype(np.float32)
    draft = rng.integers(0, vocab, size=num_draft).astype(np.int32)
    draft[:prefix] = logits.argmax(axis=-1)[:prefix]
    want = mlx_verify.greedy_verify(mx.array(draft), mx.array(logits))
    got = torch_verify.greedy_verify(torch.from_numpy(draft), torch.from_numpy(logits))
    assert all(x.dtype == torch.int32 and x.shape == () for x in got)
    assert ints(got) == ints(want)


@settings(max_examples=80, deadline=None)
@given(parents=trees(12), data=st.data())
def test_tree_verify_equals_mlx(parents, data):
    vocab = data.draw(st.integers(1, 3))  # tiny vocabularies: many duplicate siblings
    tokens = np.array(data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents), max_size=len(parents))),
                      dtype=np.int32)
    choices = np.array(data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents) + 1,
                                          max_size=len(parents) + 1)), dtype=np.int32)
    want = mlx_verify.tree_verify(mx.array(tokens), parents, mx.array(choices))
    got = torch_verify.tree_verify(torch.from_numpy(tokens), parents, torch.from_numpy(choices))
    assert all(x.dtype == torch.int32 and x.shape == () for x in got)
    assert ints(got) == ints(want)


@settings(max_examples=60, deadline=None)
@given(parents=trees(10), seed=st.integers(0, 2**32 - 1))
def test_tree_greedy_verify_equals_mlx(parents, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((len(parents) + 1, 4)).astype(np.float32)
    tokens = rng.integers(0, 4, size=len(parents)).astype(np.int32)
    want = mlx_verify.tree_greedy_verify(mx.array(tokens), parents, mx.array(logits))
    got = torch_verify.tree_greedy_verify(torch.from_numpy(tokens), parents, torch.from_numpy(logits))
    assert ints(got) == ints(want)


def test_tree_sample_verify_walks_one_keyed_sample_of_p():
    rng = np.random.default_rng(0)
    parents = (-1, -1, 0, 0, 1, 2)
    tokens = torch.tensor([0, 0, 1, 2, 1, 0], dtype=torch.int32)  # nodes 0 and 1 are equal siblings
    p = torch.from_numpy(rng.dirichlet(np.ones(3), size=len(parents) + 1))
    outs = set()
    for key in range(40):
        got = torch_verify.tree_sample_verify(tokens, parents, p, key)
        choices = torch_sampling.categorical(torch.log(p), torch_sampling.generator(key))
        assert ints(got) == ints(torch_verify.tree_verify(tokens, parents, choices))
        assert ints(got) == ints(torch_verify.tree_sample_verify(tokens, parents, p, key))
        outs.add(ints(got))
    assert len(outs) > 3


@settings(max_examples=40, deadline=None)
@given(parents=trees(10), seed=st.integers(0, 10_000))
def test_tree_residual_decide_equals_the_float64_reference_and_mlx(parents, seed):
    """The multi-round rule for sampled children, float64 on torch, against the reference
    on the same uniforms (the reference's own law is checked in tests/test_tree.py)."""
    from mlxspec.core.verify import tree_residual_decide_reference

    rng = np.random.default_rng(seed)
    rows = {r: rng.dirichlet(np.ones(4)) for r in (-1, *range(len(parents)))}
    tokens = [int(rng.choice(4, p=rows[par])) for par in parents]
    q = np.array([rows[par] for par in parents]).reshape(len(parents), 4)
    p = rng.dirichlet(np.ones(4) * 0.7, size=len(parents) + 1)
    u = rng.random(len(parents))
    last, residual = torch_verify.tree_residual_decide(torch.tensor(tokens), parents, torch.from_numpy(q),
                                                       torch.from_numpy(p), torch.from_numpy(u))
    ref_last, ref_residual = tree_residual_decide_reference(tokens, parents, q, p, u)
    assert int(last) == ref_last and np.abs(residual.numpy() - ref_residual).max() < 1e-12
    f32 = [x.astype(np.float32) for x in (q, p, u)]
    want = mlx_verify.tree_residual_decide(mx.array(tokens, mx.int32), parents, *map(mx.array, f32))
    got = torch_verify.tree_residual_decide(torch.tensor(tokens), parents, *map(torch.from_numpy, f32))
    assert int(got[0]) == want[0].item() and np.abs(got[1].numpy() - np.array(want[1])).max() < 1e-6


def test_tree_residual_verify_is_keyed_and_samples_its_residual():
    parents, tokens = (-1, -1, 0), torch.tensor([1, 1, 2])
    q = torch.tensor([[0.2, 0.8, 0.0], [0.2, 0.8, 0.0], [0.1, 0.1, 0.8]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.2, 0.3], [0.3, 0.3, 0.4], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    assert ints(torch_verify.tree_residual_verify(tokens, parents, q, p, 7)) == \
        ints(torch_verify.tree_residual_verify(tokens, parents, q, p, 7))
    # node 0 (token 1) is kept with probability 0.2 / 0.8; its twin, node 1, then always fails
    # (the residual (0.5, 0, 0.5) has nothing at token 1) and the token after the root comes
    # from norm(max(0, (0.5, 0, 0.5) - q)) = (0.375, 0, 0.625)
    outs = [ints(torch_verify.tree_residual_verify(tokens, parents, q, p, key)) for key in range(400)]
    kept = sum(last >= 0 for last, _ in outs)
    assert 60 < kept < 140 and all(last in (-1, 0, 2) for last, _ in outs)
    assert all(nxt != 1 for last, nxt in outs if last == -1)


def test_pad_vocab():
    q = torch.rand(2, 5)
    assert torch_verify.pad_vocab(None, 7) is None and torch_verify.pad_vocab(q, 5) is q
    assert torch.equal(torch_verify.pad_vocab(q, 3), q[:, :3])
    padded = torch_verify.pad_vocab(q, 8)
    assert padded.shape == (2, 8) and torch.equal(padded[:, :5], q) and not padded[:, 5:].any()


# ----------------------------------------------------------------------------- the rejection decision


def decision_cases(rng: np.random.Generator):
    """(name, draft, q, p) float64, with zeros, equal rows, drafts the target cannot emit and
    empty residuals (q == p at a rejected draft with p(d) == 0)."""
    for num_draft in (0, 1, 2, 4):
        vocab = int(rng.integers(1, 12))
        p = rng.dirichlet(np.ones(vocab), size=num_draft + 1)
        q = rng.dirichlet(np.full(vocab, 0.3), size=num_draft)
        draft = np.array([rng.choice(vocab, p=row) for row in q], dtype=np.int32)
        yield "random", draft, q, p
        yield "point-mass q", draft, None, p
        zeros = p * (rng.random(p.shape) < 0.5)
        zeros[:, 0] += 1e-3
        zeros /= zeros.sum(axis=-1, keepdims=True)
        yield "zeros in p", draft, q, zeros
        yield "zeros in p, point-mass q", draft, None, zeros
        equal = p.copy()
        equal[:num_draft] = q
        yield "p == q", draft, q, equal
        if num_draft and vocab > 1:
            empty = equal.copy()
            empty[0, draft[0]] = 0.0
            empty[0] /= empty[0].sum()
            hole = empty[:num_draft].copy()
            yield "empty residual", draft, hole, empty  # q == p, p(d_0) == 0: reject into nothing


def uniforms(rng: np.random.Generator, draft, q, p) -> list[np.ndarray]:
    """Random u, u = 0 (keep whatever p allows), the largest u, and u just either side of each
    threshold p/q."""
    num_draft = len(draft)
    out = [rng.random(num_draft), np.zeros(num_draft), np.full(num_draft, TOP_U)]
    if num_draft and q is not None:
        ratio = p[np.arange(num_draft), draft] / np.maximum(q[np.arange(num_draft), draft], 1e-300)
        out += [np.clip(ratio * (1 - 1e-9), 0, TOP_U), np.clip(ratio * (1 + 1e-9), 0, TOP_U)]
    return out


def test_torch_decision_equals_the_float64_reference():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(6):
        for name, draft, q, p in decision_cases(rng):
            for u in uniforms(rng, draft, q, p):
                n, row = torch_decide(draft, q, p, u)
                n_ref, row_ref = rejection_decide_reference(draft, q, p, u)
                assert n == n_ref, name
                assert row.dtype == np.float64
                np.testing.assert_allclose(row, row_ref, rtol=0, atol=1e-12, err_msg=name)
                seen.add((name, n < len(draft)))
    assert ("empty residual", True) in seen and ("random", True) in seen and ("random", False) in seen


def test_float32_decisions_agree_with_the_reference_away_from_ties():
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(6):
        for name, draft, q, p in decision_cases(rng):
            p32, q32 = p.astype(np.float32), None if q is None else q.astype(np.float32)
            q64 = np.eye(p.shape[-1])[draft] if q is None else q32.astype(np.float64)
            at = np.arange(len(draft))
            for _ in range(4):
                u32 = rng.random(len(draft)).astype(np.float32)
                gap = np.abs(u32 * q64[at, draft] - p32.astype(np.float64)[at, draft])
                if np.any(gap < 1e-5):
                    continue
                n_ref, row_ref = rejection_decide_reference(draft, q64, p32, u32)
                n_mlx, row_mlx = mlx_decide(draft, q32, p32, u32)
                n_torch, row_torch = torch_decide(draft, q32, p32, u32)
                assert n_mlx == n_torch == n_ref, name
                assert row_torch.dtype == np.float32
                np.testing.assert_allclose(row_mlx, row_ref, rtol=0, atol=1e-6, err_msg=name)
                np.testing.assert_allclose(row_torch, row_mlx, rtol=0, atol=1e-6, err_msg=name)
                checked += 1
    assert checked > 200


def accept_measure(draft, q, p, i: int) -> float:
    """The measure of the u_i in [0, 1) for which draft i is kept, earlier drafts kept (u = 0):
    the decision is a threshold in u_i, found by bisection."""
    u = np.zeros(len(draft))

    def kept(x: float) -> bool:
        u[i] = x
        return torch_decide(draft, q, p, u)[0] > i

    if not kept(0.0):
        return 0.0
    if kept(TOP_U):
        return 1.0
    lo, hi = 0.0, TOP_U
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) else (lo, mid)
    return hi


def emitted_law(draft, q, p, i: int, token: int) -> np.ndarray:
    """Exact law of the token emitted at position i when the drafter proposed ``token`` there:
    kept with the measured probability, else a draw from the decision's residual row."""
    draft = draft.copy()
    draft[i] = token
    accept = accept_measure(draft, q, p, i)
    law = np.zeros(p.shape[-1])
    law[token] = accept
    if accept < 1:
        u = np.zeros(len(draft))
        u[i] = TOP_U
        n, row = torch_decide(draft, q, p, u)
        assert n == i
        law += (1 - accept) * row
    return law


@pytest.mark.parametrize("vocab, num_draft", [(1, 1), (2, 1), (5, 1), (8, 3)])
def test_one_step_emits_exactly_p(vocab, num_draft):
    rng = np.random.default_rng(vocab)
    p = rng.dirichlet(np.ones(vocab), size=num_draft + 1)
    q = rng.dirichlet(np.full(vocab, 0.3), size=num_draft)
    sparse_p = p * (rng.random(p.shape) < 0.5)
    sparse_p[:, 0] += 0.1
    sparse_p /= sparse_p.sum(axis=-1, keepdims=True)
    point = np.eye(vocab)[rng.integers(vocab, size=num_draft)]
    cases = [("random", q, p), ("p == q", p[:num_draft], p), ("zeros in p", q, sparse_p),
             ("point-mass q", point, p), ("point-mass p", q, np.eye(vocab)[np.zeros(num_draft + 1, int)])]
    for name, q_rows, p_rows in cases:
        draft = p_rows[:num_draft].argmax(axis=-1).astype(np.int32)  # kept at u = 0
        for i in range(num_draft):
            law = sum(q_rows[i, t] * emitted_law(draft, q_rows, p_rows, i, t) for t in np.flatnonzero(q_rows[i]))
            np.testing.assert_allclose(law, p_rows[i], rtol=0, atol=1e-12, err_msg=f"{name}, position {i}")
            # A deterministic drafter (q None) is exact whatever it proposes.
            for t in range(vocab):
                law = emitted_law(draft, None, p_rows, i, t)
                np.testing.assert_allclose(law, p_rows[i], rtol=0, atol=1e-12, err_msg=f"{name}, None, {t}")
        n, row = torch_decide(draft, q_rows, p_rows, np.zeros(num_draft))
        assert n == num_draft
        np.testing.assert_allclose(row, p_rows[-1], rtol=0, atol=1e-15)  # the bonus row


def test_rejection_verify_monte_carlo():
    rng = np.random.default_rng(2)
    vocab, num = 5, 4000
    p = rng.dirichlet(np.ones(vocab), size=2)
    q = rng.dirichlet(np.ones(vocab), size=1)
    p[0, 3] = 0.0  # never emitted, though the drafter proposes it
    q[0, 3] += 0.3
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    p_t, q_t = torch.from_numpy(p), torch.from_numpy(q)
    drafts = rng.choice(vocab, size=num, p=q[0])
    first = np.empty(num, dtype=np.int64)
    for key, d in enumerate(drafts):
        n, tok = torch_verify.rejection_verify(torch.tensor([d]), q_t, p_t, key)
        first[key] = d if int(n) == 1 else int(tok)
    counts = np.bincount(first, minlength=vocab)
    assert counts[3] == 0
    support = p[0] > 0
    assert chisquare(counts[support], p[0][support] * num).pvalue > 1e-3


def test_point_mass_and_empty_drafts_emit_p():
    """Lookup's drafts (q None: the residual is p's row less the draft token, no one-hot) and a
    step that drafted nothing (p's own draw) both emit p, never a token of zero mass."""
    rng = np.random.default_rng(4)
    vocab, num = 5, 4000
    p = rng.dirichlet(np.ones(vocab), size=2)
    p[0, 3] = 0.0
    p_t = torch.from_numpy(p / p.sum(-1, keepdims=True))
    p = p_t.numpy()
    drafts = rng.integers(0, vocab, size=num)  # drafts 3 too, which p never emits
    chained, alone = np.empty(num, dtype=np.int64), np.empty(num, dtype=np.int64)
    for key, d in enumerate(drafts):
        n, tok = torch_verify.rejection_verify(torch.tensor([d]), None, p_t, key)
        chained[key] = d if int(n) == 1 else int(tok)
        n, tok = torch_verify.rejection_verify(torch.zeros(0, dtype=torch.int64), None, p_t[:1], key)
        assert int(n) == 0
        alone[key] = int(tok)
    support = p[0] > 0
    for first in (chained, alone):
        counts = np.bincount(first, minlength=vocab)
        assert counts[3] == 0
        assert chisquare(counts[support], p[0][support] * num).pvalue > 1e-3


def test_rejection_verify_is_keyed():
    rng = np.random.default_rng(3)
    p = torch.from_numpy(rng.dirichlet(np.ones(20), size=6).astype(np.float32))
    q = torch.from_numpy(rng.dirichlet(np.ones(20), size=5).astype(np.float32))
    draft = torch.from_numpy(rng.integers(0, 20, size=5))
    outs = set()
    for key in range(30):
        a = torch_verify.rejection_verify(draft, q, p, key)
        assert all(x.dtype == torch.int32 and x.shape == () for x in a)
        assert ints(a) == ints(torch_verify.rejection_verify(draft, q, p, key))
        outs.add(ints(a))
    assert len(outs) > 1


# ----------------------------------------------------------------------------- sampling


PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6, top_k=1),
    SamplingParams(temperature=0.8, top_k=7),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=0.5, top_p=0.3),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.7, min_p=1.0),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.8),
    SamplingParams(temperature=1.1, top_k=12, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=0.6, top_p=0.5, min_p=0.2),
]


@pytest.mark.parametrize("params", PARAMS, ids=str)
@pytest.mark.parametrize("ties", [False, True])
def test_logprobs_equal_mlx(params, ties):
    rng = np.random.default_rng(4)
    for vocab in (2, 9, 64, 300):
        logits = rng.standard_normal((3, vocab)) * 2
        logits = (np.round(logits) if ties else logits).astype(np.float32)
        want = np.array(mlx_sampling.logprobs(mx.array(logits), params))
        got = torch_sampling.logprobs(torch.from_numpy(logits), params)
        assert got.dtype == torch.float32
        got = got.numpy()
        support = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), support)
        # A few float32 ulps of |logits / T|: exp, log and the sums round differently.
        np.testing.assert_allclose(got[support], want[support], rtol=2e-6, atol=2e-6)
        p = torch_sampling.probs(torch.from_numpy(logits), params).numpy()
        np.testing.assert_allclose(p, np.array(mlx_sampling.probs(mx.array(logits), params)), rtol=0, atol=2e-6)


def test_top_k_keeps_the_lowest_ids_among_ties_as_mlx_does():
    logits = np.zeros((2, 10), dtype=np.float32)
    logits[1, [2, 5, 7]] = 1.0
    params = SamplingParams(temperature=1.0, top_k=4)
    got = torch.isfinite(torch_sampling.logprobs(torch.from_numpy(logits), params)).numpy()
    assert np.flatnonzero(got[0]).tolist() == [0, 1, 2, 3]
    assert np.flatnonzero(got[1]).tolist() == [0, 2, 5, 7]
    np.testing.assert_array_equal(got, np.isfinite(np.array(mlx_sampling.logprobs(mx.array(logits), params))))


@pytest.mark.parametrize("top_p, kept", [(0.25, 1), (0.5, 1), (0.75, 2), (0.875, 3)])
def test_top_p_boundary_at_exact_mass(top_p, kept):
    # p = 1/2, 1/4, ..., 1/32, 1/32 exactly: the nucleus reaching top_p exactly stops there.
    logits = (np.array([5.0, 4.0, 3.0, 2.0, 1.0, 1.0]) * np.log(2)).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=top_p)
    got = np.isfinite(torch_sampling.logprobs(torch.from_numpy(logits), params).numpy())
    assert np.flatnonzero(got).tolist() == list(range(kept))
    np.testing.assert_array_equal(got, np.isfinite(np.array(mlx_sampling.logprobs(mx.array(logits), params))))


def test_float64_logits_stay_float64():
    logits = torch.randn(2, 30, dtype=torch.float64)
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)
    out = torch_sampling.probs(logits, params)
    assert out.dtype == torch.float64
    assert torch.allclose(out.sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch_sampling.logprobs(logits.to(torch.bfloat16), params).dtype == torch.float32


def test_sample_is_keyed_and_greedy_is_argmax():
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.standard_normal((4, 50)).astype(np.float32))
    greedy = torch_sampling.sample(logits, SamplingParams(), None)
    assert greedy.dtype == torch.int32 and torch.equal(greedy, logits.argmax(-1).to(torch.int32))
    params = SamplingParams(temperature=1.0)
    draws = {tuple(torch_sampling.sample(logits, params, key).tolist()) for key in range(20)}
    assert len(draws) > 1
    assert torch.equal(torch_sampling.sample(logits, params, 7), torch_sampling.sample(logits, params, 7))
    assert torch.equal(torch_sampling.sample(logits, SamplingParams(temperature=1.0, top_k=1), 3),
                       greedy)


def test_samples_follow_the_processed_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    params = SamplingParams(temperature=0.7, top_k=3)
    draws = torch_sampling.sample(logits.expand(20_000, 5), params, 0).numpy()
    p = torch_sampling.probs(logits, params).numpy().astype(np.float64)
    counts = np.bincount(draws, minlength=5)
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[p > 0], p[p > 0] / p.sum() * len(draws)).pvalue > 1e-3


def test_a_draw_from_weights_follows_them_and_never_picks_a_zero():
    """``draw``: what residuals and filtered rows are drawn with, unnormalised, zeros and float32
    underflows among them (tiny weights keep their share of the cumulative sum)."""
    weights = torch.tensor([0.0, 3.0, 1e-40, 0.0, 1.0, 6.0], dtype=torch.float32)
    draws = torch_sampling.draw(weights.expand(30_000, 6), torch_sampling.generator(3)).numpy()
    counts = np.bincount(draws, minlength=6)
    assert counts[[0, 2, 3]].sum() == 0 and draws.dtype == np.int32
    want = np.array([3.0, 1.0, 6.0]) / 10 * len(draws)
    assert chisquare(counts[[1, 4, 5]], want).pvalue > 1e-3
    one = torch_sampling.draw(weights, torch_sampling.generator(9))
    assert one.shape == () and torch.equal(one, torch_sampling.draw(weights, torch_sampling.generator(9)))


def test_split_key():
    keys = torch_sampling.split_key(42, 5)
    assert keys == torch_sampling.split_key(42, 5) != torch_sampling.split_key(43, 5)
    assert len(set(keys)) == 5 and all(isinstance(k, int) and 0 <= k < 2**63 for k in keys)
    assert torch_sampling.split_key(42, 2) == keys[:2]


def test_block_decide_equals_the_float64_reference():
    rng = np.random.default_rng(7)
    for k in (1, 2, 3, 5):
        for _ in range(15):
            q = rng.dirichlet(np.full(6, 0.5), size=k)
            p = rng.dirichlet(np.full(6, 0.5), size=k + 1)
            p[rng.integers(k + 1), rng.integers(6)] = 0.0  # a zero in the target's rows
            p /= p.sum(-1, keepdims=True)
            draft = np.array([rng.choice(6, p=q[i]) for i in range(k)])
            eta = rng.random(k)
            want_n, want_row = mlx_verify.block_decide_reference(draft, q, p, eta)
            n, row = torch_verify.block_decide(torch.tensor(draft), torch.tensor(q), torch.tensor(p), torch.tensor(eta))
            assert n.item() == want_n and row.dtype == torch.float64
            np.testing.assert_allclose(row.numpy(), want_row, atol=1e-12)
    key = 9
    draft, q, p = torch.tensor([1, 2]), torch.tensor(q[:2]), torch.tensor(p[:3])
    assert [x.item() for x in torch_verify.block_verify(draft, q, p, key)] == \
        [x.item() for x in torch_verify.block_verify(draft, q, p, key)]
