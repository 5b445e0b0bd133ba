"""Tests for mlxspec.losses against float64 NumPy references written with plain loops.

Values are compared with the references, MLX gradients with central finite differences of the
references, and the limits the definitions promise are checked on constructed inputs.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.training import losses

B, L, V, K = 2, 6, 7, 3
EXTRA = 3  # teacher columns outside the draft's vocabulary: makes the teacher sub-normalised
VALUE_TOL = dict(rtol=1e-5, atol=1e-7)
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- float64 NumPy references


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        m = row.max()
        out[idx] = row - m - math.log(sum(math.exp(v - m) for v in row))
    return out


def ref_window(a: np.ndarray, k: int, mask: np.ndarray) -> np.ndarray:
    n_b, n_l = a.shape
    out = np.zeros((n_b, n_l))
    for b in range(n_b):
        for s in range(n_l):
            if mask[b, s] == 0:
                continue
            prod, total = 1.0, 0.0
            for j in range(k):
                i = s + j
                if i >= n_l or mask[b, i] == 0:
                    break
                prod *= a[b, i]
                total += prod
            out[b, s] = total
    return out


def ref_masked_mean(x: np.ndarray, mask: np.ndarray) -> float:
    total, count = 0.0, 0
    for idx in np.ndindex(x.shape):
        if mask[idx] > 0:
            total += x[idx]
            count += 1
    return total / max(count, 1)


def ref_kl(tlp, dl, temp, mask) -> float:
    per = np.zeros(mask.shape)
    for b, l in np.ndindex(mask.shape):
        if mask[b, l] == 0:
            continue
        p = np.exp(ref_log_softmax(tlp[b, l] / temp))  # renormalised over V
        q = np.exp(ref_log_softmax(dl[b, l] / temp))
        per[b, l] = sum(pv * math.log(pv / qv) for pv, qv in zip(p, q) if pv > 0)
    return ref_masked_mean(per, mask)


def ref_eal_accept(dl, targets, mask, sharpen) -> np.ndarray:
    a = np.zeros(mask.shape)
    for b, l in np.ndindex(mask.shape):
        if mask[b, l] and targets[b, l] >= 0:
            a[b, l] = np.exp(ref_log_softmax(dl[b, l] / sharpen))[targets[b, l]]
    return a


def ref_eal(dl, targets, k, mask, sharpen=1.0) -> float:
    a = ref_eal_accept(dl, targets, mask, sharpen)
    return -ref_masked_mean(ref_window(a, k, mask), mask) / k


def ref_wtv_accept(tlp, dl, temp, mask, min_p=0.0) -> np.ndarray:
    beta = np.zeros(mask.shape)
    for b, l in np.ndindex(mask.shape):
        if mask[b, l] == 0:
            continue
        # The module's convention: exact sub-normalised teacher at T=1, renormalised over V else.
        p = np.exp(tlp[b, l]) if temp == 1.0 else np.exp(ref_log_softmax(tlp[b, l] / temp))
        if min_p > 0:  # the sampler's filter: tokens below min_p x the top dropped, the rest renormalised
            p = np.where(p >= min_p * p.max(), p, 0.0)
            p = p / p.sum()
        q = np.exp(ref_log_softmax(dl[b, l] / temp))
        beta[b, l] = sum(min(pv, qv) for pv, qv in zip(p, q))
    return beta


def ref_wtv(tlp, dl, temp, k, mask, min_p=0.0) -> float:
    beta = ref_wtv_accept(tlp, dl, temp, mask, min_p)
    return -ref_masked_mean(ref_window(beta, k, mask), mask) / k


def ref_grpo(new, old, adv, valid, ref_kl_value, clip=0.2, kl_coef=0.02) -> float:
    total, count = 0.0, 0
    for g, j in np.ndindex(new.shape):
        if valid[g, j] == 0:
            continue
        r = math.exp(new[g, j] - old[g, j])
        total += min(r * adv[g], min(max(r, 1 - clip), 1 + clip) * adv[g])
        count += 1
    return -total / max(count, 1) + kl_coef * ref_kl_value


def fd_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        grad[idx] = (f(xp) - f(xm)) / (2 * eps)
    return grad


def to_np(x: mx.array) -> np.ndarray:
    return np.array(x, dtype=np.float64)


# ---------------------------------------------------------------- inputs


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    full = rng.normal(size=(B, L, V + EXTRA)) * 2.0
    full[..., V:] = full[..., V:] * 0.25 - 1.0  # a modest tail: a few percent of the mass
    full[0, 2, V] = 10.0  # teacher's argmax outside the draft vocabulary at two positions
    full[1, 1, V + 1] = 10.0
    full_logp = ref_log_softmax(full)
    teacher_logp = full_logp[..., :V]  # sub-normalised: the EXTRA columns' mass is missing
    targets = np.argmax(full_logp, axis=-1)
    targets = np.where(targets < V, targets, -1)
    draft = rng.normal(size=(B, L, V)) * 2.0
    # a prompt at the start of row 0, a gap and padding in row 1: windows must stop there
    mask = np.array([[0, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0]], dtype=np.float64)
    return teacher_logp, draft, targets, mask


def mlx_inputs(teacher_logp, draft, targets, mask):
    return (
        mx.array(teacher_logp.astype(np.float32)),
        mx.array(draft.astype(np.float32)),
        mx.array(targets.astype(np.int32)),
        mx.array(mask.astype(np.float32)),
    )


def test_fixture_is_sub_normalised_and_has_out_of_vocab_targets(inputs):
    teacher_logp, _, targets, _ = inputs
    assert np.all(np.exp(teacher_logp).sum(-1) < 1.0)
    assert (targets == -1).sum() == 2


# ---------------------------------------------------------------- values and gradients


def test_temperature_logprobs_matches_reference(inputs):
    _, draft, _, _ = inputs
    got = to_np(losses.temperature_logprobs(mx.array(draft.astype(np.float32)), 0.7))
    np.testing.assert_allclose(got, ref_log_softmax(draft / 0.7), rtol=1e-5, atol=1e-6)


def test_window_expected_length_matches_reference(inputs):
    rng = np.random.default_rng(1)
    _, _, _, mask = inputs
    a = rng.uniform(0.05, 1.0, size=(B, L))
    for k in (1, 2, 3, 6, 9):
        got = to_np(losses.window_expected_length(mx.array(np.log(a).astype(np.float32)), k, mx.array(mask)))
        np.testing.assert_allclose(got, ref_window(a, k, mask), **VALUE_TOL)


@pytest.mark.parametrize("temp", [1.0, 0.7, 2.0])
def test_kl_value_and_gradient(inputs, temp):
    tlp, draft, _, mask = inputs
    t, d, _, m = mlx_inputs(*inputs)
    value, grad = mx.value_and_grad(lambda x: losses.kl_loss(t, x, temp, m))(d)
    np.testing.assert_allclose(float(value), ref_kl(tlp, draft, temp, mask), **VALUE_TOL)
    np.testing.assert_allclose(to_np(grad), fd_grad(lambda x: ref_kl(tlp, x, temp, mask), draft), **GRAD_TOL)


@pytest.mark.parametrize("sharpen", [1.0, 0.5])
def test_eal_value_and_gradient(inputs, sharpen):
    _, draft, targets, mask = inputs
    _, d, tg, m = mlx_inputs(*inputs)
    value, grad = mx.value_and_grad(lambda x: losses.eal_loss(x, tg, K, m, sharpen))(d)
    np.testing.assert_allclose(float(value), ref_eal(draft, targets, K, mask, sharpen), **VALUE_TOL)
    expected = fd_grad(lambda x: ref_eal(x, targets, K, mask, sharpen), draft)
    np.testing.assert_allclose(to_np(grad), expected, **GRAD_TOL)
    # a position whose target is outside V can never be accepted: no gradient reaches it
    assert np.all(to_np(grad)[targets == -1] == 0.0)


@pytest.mark.parametrize("temp", [1.0, 0.7, 2.0])
def test_wtv_value_and_gradient(inputs, temp):
    tlp, draft, _, mask = inputs
    t, d, _, m = mlx_inputs(*inputs)
    value, grad = mx.value_and_grad(lambda x: losses.wtv_loss(t, x, temp, K, m))(d)
    np.testing.assert_allclose(float(value), ref_wtv(tlp, draft, temp, K, mask), **VALUE_TOL)
    expected = fd_grad(lambda x: ref_wtv(tlp, x, temp, K, mask), draft)
    np.testing.assert_allclose(to_np(grad), expected, **GRAD_TOL)


@pytest.mark.parametrize("temp, min_p", [(1.0, 0.1), (1.0, 0.5), (0.7, 0.2)])
def test_wtv_with_a_min_p_teacher_value_and_gradient(inputs, temp, min_p):
    """At a min-p the teacher is filtered as the sampler filters p; q stays whole."""
    tlp, draft, _, mask = inputs
    t, d, _, m = mlx_inputs(*inputs)
    value, grad = mx.value_and_grad(lambda x: losses.wtv_loss(t, x, temp, K, m, min_p))(d)
    np.testing.assert_allclose(float(value), ref_wtv(tlp, draft, temp, K, mask, min_p), **VALUE_TOL)
    expected = fd_grad(lambda x: ref_wtv(tlp, x, temp, K, mask, min_p), draft)
    np.testing.assert_allclose(to_np(grad), expected, **GRAD_TOL)
    assert float(value) != pytest.approx(ref_wtv(tlp, draft, temp, K, mask), abs=1e-4)  # the filter changes it


def test_a_min_p_teacher_is_what_the_sampler_draws_from():
    """At a min-p, wtv's teacher is ``core.sampling``'s distribution over the same logits (kept
    tokens and proportions, renormalised): a draft that is exactly that distribution overlaps it
    fully, at T = 1 and at another temperature; the whole teacher it overlaps only in part."""
    from mlxspec.core.sampling import SamplingParams, probs

    rng = np.random.default_rng(5)
    logits = rng.normal(scale=2.0, size=(1, 6, 40)).astype(np.float32)
    teacher = mx.array(logits - np.log(np.exp(logits).sum(-1, keepdims=True)) - 0.05)  # sub-normalised, as stored
    mask = mx.ones((1, 6))
    for temp, min_p in ((1.0, 0.05), (1.0, 0.1), (0.7, 0.3)):
        sampler = probs(teacher, SamplingParams(temp, min_p=min_p))
        assert (to_np(sampler) == 0).any()  # the filter drops tokens here
        draft = temp * mx.log(mx.maximum(sampler, 1e-30))  # q^T = the sampler's distribution
        np.testing.assert_allclose(to_np(losses.wtv_acceptance(teacher, draft, temp, mask, min_p)), 1.0, atol=1e-5)
        assert to_np(losses.wtv_acceptance(teacher, draft, temp, mask)).max() < 1.0 - 1e-3


def test_fits_marks_where_the_teachers_token_is_in_the_drafts_top():
    logits = mx.array([[[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 5.0]]])
    targets = mx.array([[2, 0, -1]])  # ranks 2 and 4; the last is outside V
    assert to_np(losses.fits(logits, targets, 1)).tolist() == [[False, False, False]]
    assert to_np(losses.fits(logits, targets, 2)).tolist() == [[True, False, False]]
    assert to_np(losses.fits(logits, targets, 4)).tolist() == [[True, True, False]]


def test_where_fit_keeps_the_value_and_drops_the_gradient_where_it_cannot_fit(inputs):
    """GRIFFIN's mask: the value is unchanged; a position the draft cannot fit sends no gradient
    to its logits (each position's acceptance reads its own row only), the others send theirs."""
    tlp, draft, targets, mask = inputs
    t, d, tg, m = mlx_inputs(*inputs)

    def loss(x, top):
        a = losses.wtv_acceptance(t, x, 1.0, m)
        if top:
            a = losses.where_fit(a, losses.fits(x, tg, top))
        return -(a * m).sum()

    fit = np.array(losses.fits(d, tg, 2))
    assert fit.any() and (~fit & (mask > 0)).any()  # the fixture has both kinds of position
    whole, masked = (mx.value_and_grad(lambda x: loss(x, top))(d) for top in (0, 2))
    assert float(whole[0]) == pytest.approx(float(masked[0]), rel=1e-6)
    g_whole, g_masked = to_np(whole[1]), to_np(masked[1])
    assert np.all(g_masked[~fit] == 0.0) and np.abs(g_whole[~fit & (mask > 0)]).max() > 0
    np.testing.assert_allclose(g_masked[fit], g_whole[fit], rtol=1e-6, atol=1e-9)


def test_acceptance_helpers_match_reference(inputs):
    tlp, draft, targets, mask = inputs
    t, d, tg, m = mlx_inputs(*inputs)
    eal_a = to_np(losses.eal_acceptance(d, tg, m))
    np.testing.assert_allclose(eal_a, ref_eal_accept(draft, targets, mask, 1.0), **VALUE_TOL)
    wtv_a = to_np(losses.wtv_acceptance(t, d, 0.7, m))
    np.testing.assert_allclose(wtv_a, ref_wtv_accept(tlp, draft, 0.7, mask), **VALUE_TOL)


def _grpo_inputs():
    rng = np.random.default_rng(2)
    g, k, v = 4, 3, 7
    logits = rng.normal(size=(g, k, v))
    tokens = rng.integers(0, v, size=(g, k))
    # old log-probs off by up to +-0.5: ratios fall inside and outside the clip range
    shift = np.array([[0.4, -0.3, 0.05], [-0.5, 0.1, 0.3], [0.02, 0.45, -0.4], [0.3, -0.1, 0.2]])
    old = np.take_along_axis(ref_log_softmax(logits), tokens[..., None], -1)[..., 0] + shift
    adv = np.array([1.3, -0.7, 0.4, -1.0])
    valid = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=np.float64)
    return logits, tokens, old, adv, valid


def test_grpo_value_and_gradient():
    logits, tokens, old, adv, valid = _grpo_inputs()
    ref_kl_value = 0.37

    def ref(x):
        new = np.take_along_axis(ref_log_softmax(x), tokens[..., None], -1)[..., 0]
        return ref_grpo(new, old, adv, valid, ref_kl_value)

    tok = mx.array(tokens.astype(np.int32))[..., None]

    def loss(x):
        new = mx.take_along_axis(losses.temperature_logprobs(x, 1.0), tok, axis=-1)[..., 0]
        return losses.grpo_loss(new, mx.array(old.astype(np.float32)), mx.array(adv.astype(np.float32)),
                                mx.array(valid.astype(np.float32)), mx.array(ref_kl_value))

    value, grad = mx.value_and_grad(loss)(mx.array(logits.astype(np.float32)))
    np.testing.assert_allclose(float(value), ref(logits), **VALUE_TOL)
    np.testing.assert_allclose(to_np(grad), fd_grad(ref, logits), **GRAD_TOL)
    assert np.all(to_np(grad)[valid == 0] == 0.0)  # positions after the first rejection


# ---------------------------------------------------------------- limits and properties


def test_window_truncates_at_mask_and_sequence_end():
    log_a = mx.array(np.log([[0.5, 0.5, 0.5, 0.5]]).astype(np.float32))
    mask = mx.array([[1.0, 1.0, 0.0, 1.0]])
    got = to_np(losses.window_expected_length(log_a, 3, mask))
    # start 0: 0.5 + 0.25, stopped by the mask; start 3: one position before the end
    np.testing.assert_allclose(got, [[0.75, 0.5, 0.0, 0.5]], rtol=1e-6)


def test_window_full_acceptance_counts_k_where_the_window_fits():
    mask = np.array([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]], dtype=np.float32)
    got = to_np(losses.window_expected_length(mx.zeros((2, 6)), 3, mx.array(mask)))
    np.testing.assert_array_equal(got, [[3, 3, 3, 3, 2, 1], [0, 3, 3, 2, 1, 0]])


def test_window_is_safe_for_very_negative_log_acceptance():
    log_a = mx.array([[-1e30, -np.inf, 0.0, -200.0]], dtype=mx.float32)
    mask = mx.ones((1, 4))
    value, grad = mx.value_and_grad(lambda x: losses.window_expected_length(x, 3, mask).sum())(log_a)
    assert np.isfinite(float(value)) and np.all(np.isfinite(to_np(grad)))
    got = to_np(losses.window_expected_length(log_a, 3, mask))
    np.testing.assert_allclose(got, [[0, 0, 1, 0]], atol=1e-30)
    # NaN under the mask (padding) reaches neither the value nor the gradient
    log_a = mx.array([[0.0, np.nan, -0.5]], dtype=mx.float32)
    mask = mx.array([[1.0, 0.0, 1.0]])
    value, grad = mx.value_and_grad(lambda x: losses.window_expected_length(x, 3, mask).sum())(log_a)
    assert float(value) == pytest.approx(1.0 + math.exp(-0.5))
    assert to_np(grad)[0, 1] == 0.0 and np.all(np.isfinite(to_np(grad)))


def test_identical_distributions_accept_everything():
    rng = np.random.default_rng(3)
    draft = rng.normal(size=(B, L, V)) * 3.0
    mask = np.ones((B, L), dtype=np.float32)
    d = mx.array(draft.astype(np.float32))
    t = losses.temperature_logprobs(d, 1.0)  # the teacher is the draft itself
    m = mx.array(mask)
    for temp in (1.0, 0.6, 1.7):
        beta = to_np(losses.wtv_acceptance(t, d, temp, m))
        np.testing.assert_allclose(beta, 1.0, atol=1e-6)
    windows = np.minimum(K, L - np.arange(L))  # truncated only by the sequence end
    assert float(losses.wtv_loss(t, d, 0.8, K, m)) == pytest.approx(-windows.mean() / K, abs=1e-6)
    assert float(losses.wtv_loss(t, d, 0.8, 1, m)) == pytest.approx(-1.0, abs=1e-6)


def test_sub_normalised_teacher_at_t1_overlap_is_its_known_mass():
    # p = 0.8 q inside V (20% of the teacher's mass lies outside the draft's vocabulary):
    # min(p, q) = p, so beta = 0.8 exactly -- the missing tail is where q = 0.
    rng = np.random.default_rng(4)
    d = mx.array(rng.normal(size=(B, L, V)).astype(np.float32))
    t = losses.temperature_logprobs(d, 1.0) + math.log(0.8)
    beta = to_np(losses.wtv_acceptance(t, d, 1.0, mx.ones((B, L))))
    np.testing.assert_allclose(beta, 0.8, rtol=1e-6)


def test_wtv_at_low_temperature_is_the_greedy_indicator():
    rng = np.random.default_rng(5)
    n_b, n_l, v, k = 3, 8, 7, 3
    temp = 1e-3
    # logits a permutation of 0..v-1: every gap is >= 1, so at T=1e-3 the tempered distributions
    # are one-hot at the argmax up to exp(-1000)
    teacher = np.stack([rng.permutation(v) for _ in range(n_b * n_l)]).reshape(n_b, n_l, v) * 1.0
    draft = np.stack([rng.permutation(v) for _ in range(n_b * n_l)]).reshape(n_b, n_l, v) * 1.0
    agree = rng.random((n_b, n_l)) < 0.6
    for b, l in zip(*np.nonzero(agree)):
        draft[b, l] = teacher[b, l]
    teacher_logp = ref_log_softmax(teacher)[..., :v] - 0.1  # sub-normalised too
    mask = np.ones((n_b, n_l))
    mask[0, :2] = 0
    mask[2, -1] = 0
    t_arg, d_arg = teacher.argmax(-1), draft.argmax(-1)
    indicator = (t_arg == d_arg).astype(np.float64) * mask

    t, d, m = (mx.array(x.astype(np.float32)) for x in (teacher_logp, draft, mask))
    beta = losses.wtv_acceptance(t, d, temp, m)
    np.testing.assert_allclose(to_np(beta), indicator, atol=1e-6)

    # window length from each start == greedy leading-match count over that start's window
    windows = to_np(losses.window_expected_length(mx.log(beta), k, m))
    for b in range(n_b):
        starts = [s for s in range(n_l) if mask[b, s]]
        drafted = np.full((len(starts), k), -1)
        targets = np.full((len(starts), k), -2)  # padding never matches
        for row, s in enumerate(starts):
            for j in range(k):
                if s + j < n_l and mask[b, s + j]:
                    drafted[row, j], targets[row, j] = d_arg[b, s + j], t_arg[b, s + j]
        greedy = to_np(losses.simulated_accept_length_greedy(mx.array(drafted), mx.array(targets)))
        np.testing.assert_allclose(windows[b, starts], greedy, atol=1e-5)
        np.testing.assert_allclose(windows[b, starts], ref_window(indicator, k, mask)[b, starts], atol=1e-5)
    loss = float(losses.wtv_loss(t, d, temp, k, m))
    assert loss == pytest.approx(-ref_masked_mean(ref_window(indicator, k, mask), mask) / k, abs=1e-5)


def test_eal_perfect_draft():
    rng = np.random.default_rng(6)
    targets = rng.integers(0, V, size=(B, L))
    draft = np.where(np.arange(V) == targets[..., None], 60.0, 0.0)  # q(target) = 1 - 6e-26
    mask = np.ones((B, L), dtype=np.float32)
    d, tg, m = mx.array(draft.astype(np.float32)), mx.array(targets.astype(np.int32)), mx.array(mask)
    assert float(losses.eal_loss(d, tg, 1, m)) == pytest.approx(-1.0, abs=1e-6)
    windows = np.minimum(K, L - np.arange(L))
    assert float(losses.eal_loss(d, tg, K, m)) == pytest.approx(-windows.mean() / K, abs=1e-6)
    # one unreachable target (-1) at position 0 of row 0 removes that start's window entirely
    targets2 = targets.copy()
    targets2[0, 0] = -1
    tg2 = mx.array(targets2.astype(np.int32))
    expected = -(windows.sum() * 2 - windows[0]) / (2 * L) / K
    assert float(losses.eal_loss(d, tg2, K, m)) == pytest.approx(expected, abs=1e-6)


def test_masked_rows_and_extreme_inputs_never_give_nan(inputs):
    tlp, draft, targets, mask = inputs
    draft = draft.copy()
    tlp = tlp.copy()
    draft[0, 0] = np.nan  # masked row: garbage must not leak
    draft[1, 5] = np.inf
    tlp[0, 0] = np.nan
    tlp[1, 5] = -np.inf
    draft[0, 3, :4] = -1e30  # very negative logits in trained rows
    draft[1, 3] = -1e4
    tlp[0, 4, 2] = -np.inf  # the teacher has exactly zero mass on a column
    t, d, tg, m = mlx_inputs(tlp, draft, targets, mask)
    fns = {
        "kl": lambda x: losses.kl_loss(t, x, 0.7, m),
        "kl_t1": lambda x: losses.kl_loss(t, x, 1.0, m),
        "eal": lambda x: losses.eal_loss(x, tg, K, m),
        "eal_sharp": lambda x: losses.eal_loss(x, tg, K, m, sharpen=0.25),
        "wtv": lambda x: losses.wtv_loss(t, x, 1.0, K, m),
        "wtv_t": lambda x: losses.wtv_loss(t, x, 0.5, K, m),
    }
    for name, fn in fns.items():
        value, grad = mx.value_and_grad(fn)(d)
        g = to_np(grad)
        assert np.isfinite(float(value)), name
        assert np.all(np.isfinite(g)), name
        assert np.all(g[mask == 0] == 0.0), name


def test_all_masked_gives_zero_not_nan(inputs):
    t, d, tg, _ = mlx_inputs(*inputs)
    m = mx.zeros((B, L))
    assert float(losses.kl_loss(t, d, 1.0, m)) == 0.0
    assert float(losses.eal_loss(d, tg, K, m)) == 0.0
    assert float(losses.wtv_loss(t, d, 1.0, K, m)) == 0.0


def test_half_precision_inputs_are_computed_in_float32(inputs):
    t, d, tg, m = mlx_inputs(*inputs)
    value = losses.kl_loss(t.astype(mx.bfloat16), d.astype(mx.bfloat16), 1.0, m)
    assert value.dtype == mx.float32
    t32, d32 = (x.astype(mx.bfloat16).astype(mx.float32) for x in (t, d))
    ref = losses.kl_loss(t32, d32, 1.0, m)
    assert float(value) == pytest.approx(float(ref), rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    temp=st.floats(0.2, 5.0),
    scale=st.floats(0.1, 15.0),
    mass=st.floats(0.05, 1.0),
)
def test_kl_is_zero_for_identical_and_nonnegative_otherwise(seed, temp, scale, mass):
    rng = np.random.default_rng(seed)
    draft = rng.normal(size=(B, L, V)) * scale
    mask = (rng.random((B, L)) < 0.8).astype(np.float32)
    d, m = mx.array(draft.astype(np.float32)), mx.array(mask)
    # the same distribution, sub-normalised and with shifted logits: renormalised p^T == q^T
    same = losses.temperature_logprobs(d + 3.0, 1.0) + math.log(mass)
    assert abs(float(losses.kl_loss(same, d, temp, m))) < 1e-5
    other = ref_log_softmax(rng.normal(size=(B, L, V)) * scale) + math.log(mass)
    value = float(losses.kl_loss(mx.array(other.astype(np.float32)), d, temp, m))
    assert value >= -1e-6
    assert value == pytest.approx(ref_kl(other, draft, temp, mask), rel=1e-4, abs=1e-5)


# ---------------------------------------------------------------- GRPO stage and schedules


def test_simulated_accept_length_greedy_hand_worked():
    draft = mx.array([[1, 2, 3], [1, 5, 3], [4, 2, 3], [1, 2, 3]])
    target = mx.array([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 9]])
    got = losses.simulated_accept_length_greedy(draft, target)
    assert got.dtype == mx.int32
    assert got.tolist() == [3, 1, 0, 2]


def test_simulated_accept_length_sampling_hand_worked():
    p = mx.array([[0.5, 0.2, 0.9], [0.1, 1.0, 1.0], [0.3, 0.0, 0.5]])
    q = mx.array([[0.25, 0.4, 0.3], [0.4, 0.5, 0.5], [0.0, 0.0, 0.6]])
    # row 0: ratios 1, 0.5, 1 -> 1 + 0.5 + 0.5; row 1: 0.25, 1, 1 -> 3 * 0.25;
    # row 2: q = 0 and q = p = 0 count as accepted, then 0.5/0.6 -> 1 + 1 + 5/6
    got = to_np(losses.simulated_accept_length_sampling(p, q))
    np.testing.assert_allclose(got, [2.0, 0.75, 2.0 + 5.0 / 6.0], rtol=1e-6)


def test_group_advantages():
    rewards = mx.array([0.0, 1.0, 3.0, 2.0, 2.0])
    adv = to_np(losses.group_advantages(rewards))
    r = np.array([0.0, 1.0, 3.0, 2.0, 2.0])
    np.testing.assert_allclose(adv, (r - r.mean()) / (r.std() + 1e-4), rtol=1e-5)
    assert abs(adv.mean()) < 1e-6
    assert np.all(to_np(losses.group_advantages(mx.full((4,), 2.5))) == 0.0)  # no spread, no NaN


def test_grpo_gradient_sign_follows_advantage():
    v = 5
    logits = mx.zeros((2, 1, v))
    tokens = mx.array([[1], [3]])
    adv = mx.array([1.0, -1.0])
    valid = mx.ones((2, 1))

    def new_logp(x):
        return mx.take_along_axis(losses.temperature_logprobs(x, 1.0), tokens[..., None], axis=-1)[..., 0]

    old = new_logp(logits)  # sampled from the current draft: r = 1, inside the clip range
    grad = to_np(mx.grad(lambda x: losses.grpo_loss(new_logp(x), old, adv, valid, mx.array(0.0)))(logits))
    assert grad[0, 0, 1] < 0  # descending raises the positively rewarded token's logit
    assert grad[1, 0, 3] > 0
    stepped = logits - 0.5 * mx.array(grad)
    moved = to_np(new_logp(stepped) - old)
    assert moved[0, 0] > 0 and moved[1, 0] < 0


def test_grpo_clipping_and_kl_term():
    new = mx.array([[math.log(1.5)], [math.log(0.5)]])
    old = mx.zeros((2, 1))
    adv = mx.array([1.0, -1.0])
    valid = mx.ones((2, 1))
    ref_kl = mx.array(0.5)
    # r = 1.5 > 1.2 with A > 0 and r = 0.5 < 0.8 with A < 0: both clipped, no gradient
    value, grad = mx.value_and_grad(lambda x: losses.grpo_loss(x, old, adv, valid, ref_kl))(new)
    assert float(value) == pytest.approx(-(1.2 * 1.0 + 0.8 * -1.0) / 2 + 0.02 * 0.5, rel=1e-6)
    assert np.all(to_np(grad) == 0.0)
    # garbage after the first rejection is ignored
    new2 = mx.array([[0.0, np.nan]])
    old2 = mx.array([[0.0, np.inf]])
    out, grad = mx.value_and_grad(
        lambda x: losses.grpo_loss(x, old2, mx.array([2.0]), mx.array([[1.0, 0.0]]), mx.array(0.0))
    )(new2)
    assert float(out) == pytest.approx(-2.0)
    np.testing.assert_allclose(to_np(grad), [[-2.0, 0.0]], rtol=1e-6)


def test_blended_loss_and_kl_weight():
    assert float(losses.blended_loss(mx.array(2.0), mx.array(-1.0), 0.25)) == pytest.approx(0.25 * 2 - 0.75)
    assert losses.kl_weight(0, 100) == 1.0
    assert losses.kl_weight(25, 100) == pytest.approx(0.5)
    assert losses.kl_weight(50, 100) == 0.0
    assert losses.kl_weight(90, 100) == 0.0
    assert losses.kl_weight(10, 100, start=1.0, end=0.2, anneal_frac=0.2) == pytest.approx(0.6)
    assert losses.kl_weight(5, 100, anneal_frac=0.0, end=0.3) == 0.3
