import mlx.core as mx
import numpy as np
import pytest

from mlxspec.core.sampling import SamplingParams, probs, sample
from mlxspec.errors import MlxspecError

LOGITS = mx.array([[2.0, 1.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(), None).tolist() == [4, 0]


def test_temperature_one_is_softmax():
    p = np.array(probs(LOGITS, SamplingParams(temperature=1.0)))
    e = np.exp(np.array(LOGITS) - np.array(LOGITS).max(-1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), rtol=1e-6)


def test_top_k_keeps_k_and_renormalises():
    p = np.array(probs(LOGITS[:1], SamplingParams(temperature=1.0, top_k=2)))[0]
    assert np.count_nonzero(p) == 2 and p[4] > p[0] > 0
    assert p.sum() == pytest.approx(1.0, abs=1e-6)


def test_top_p_keeps_smallest_set_reaching_mass():
    # softmax of LOGITS[0]: token 4 has ~0.61, token 0 ~0.22 -> p=0.7 keeps both
    p = np.array(probs(LOGITS[:1], SamplingParams(temperature=1.0, top_p=0.7)))[0]
    assert set(np.flatnonzero(p)) == {0, 4}
    assert p.sum() == pytest.approx(1.0, abs=1e-6)


def test_samples_follow_the_processed_distribution():
    params = SamplingParams(temperature=0.7, top_k=3)
    keys = mx.random.split(mx.random.key(0), 4000)
    draws = np.array(mx.vmap(lambda k: sample(LOGITS[0], params, k))(keys))
    freq = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(freq, np.array(probs(LOGITS[0], params)), atol=0.03)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
        (dict(top_p=0.0), r"top-p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top-p must be in \(0, 1\]"),
        (dict(top_k=-1), "top-k must be >= 0"),
        (dict(min_p=2.0), r"min-p must be in \[0, 1\]"),
    ],
)
def test_bad_parameters(kwargs, message):
    with pytest.raises(MlxspecError, match=message):
        SamplingParams(**kwargs)


# --- coupled sampling (drafter-invariant: Gumbel-max with noise keyed by seed and position) ------------

def _coupled_backends():
    import mlxspec.core.sampling as core_sampling

    out = [pytest.param(core_sampling.coupled_scores, lambda x: mx.array(x), lambda a: np.array(a), id="mlx")]
    try:  # torch is an optional extra
        import torch

        from mlxspec.torchpath import sampling as torch_sampling
    except ImportError:
        return out
    return out + [pytest.param(torch_sampling.coupled_scores, lambda x: torch.tensor(x), lambda a: a.numpy(), id="torch")]


@pytest.mark.parametrize("scores, array, numpy", _coupled_backends())
def test_coupled_noise_depends_on_seed_and_position_only(scores, array, numpy):
    params = SamplingParams(temperature=1.0, top_k=3)
    logits = array(np.linspace(-2, 2, 10, dtype=np.float32)[None].repeat(3, 0))
    a = numpy(scores(logits, params, 7, [4, 5, 6]))
    again = numpy(scores(logits[1:2], params, 7, [5]))
    np.testing.assert_array_equal(a[1], again[0])  # the same draw whatever else is drawn with it
    assert not np.array_equal(a[0], a[1])  # another position, other noise
    assert not np.array_equal(a[0], numpy(scores(logits[:1], params, 8, [4]))[0])  # another seed too
    assert np.isneginf(a[:, :7]).all() and np.isfinite(a[:, 7:]).all()  # filtered tokens never win


@pytest.mark.parametrize("scores, array, numpy", _coupled_backends())
def test_coupled_draws_follow_the_processed_distribution(scores, array, numpy):
    """One draw per position, 6,000 positions: the argmax frequencies against p by a chi-square
    test, and the same test refuses the unprocessed distribution (the check can fail)."""
    from scipy.stats import chisquare

    params = SamplingParams(temperature=0.7, min_p=0.05)
    raw = np.array([1.0, 0.5, 0.0, -0.5, -1.0, -4.0], dtype=np.float32)
    n = 6000
    picks = numpy(scores(array(np.tile(raw, (n, 1))), params, 3, range(n))).argmax(-1)
    counts = np.bincount(picks, minlength=raw.size)
    p = np.array(probs(mx.array(raw), params)).astype(np.float64)
    kept = p > 0
    assert counts[~kept].sum() == 0
    assert chisquare(counts[kept], p[kept] / p[kept].sum() * n).pvalue > 1e-3
    plain = np.exp(raw.astype(np.float64))
    assert chisquare(counts[kept], plain[kept] / plain[kept].sum() * n).pvalue < 1e-6


def test_coupling_is_labelled_and_tree_drafts_are_the_drafters_top_choices():
    p = SamplingParams(temperature=1.0, min_p=0.1, coupled=True)
    assert p.label == "T=1 min-p=0.1 coupled" and p.is_coupled and p.for_tree_drafts().greedy
    off = SamplingParams(coupled=True)  # greedy: nothing to couple
    assert not off.is_coupled and off.for_tree_drafts() is off and off.label == "T=0"


@pytest.mark.parametrize("scores, array, numpy", _coupled_backends())
def test_a_coupled_key_draws_row_i_with_the_noise_of_its_position_plus_i(scores, array, numpy):
    """A drafter's draws under coupling are the argmax of its own processed distribution plus
    the noise the target draws those positions with: equal to the target's draw wherever the
    rows are equal, and split in order, position by position."""
    from mlxspec.core import ops as mlx_ops
    from mlxspec.core.sampling import CoupledKey

    backend_sample, backend_split = mlx_ops.sample, mlx_ops.split
    if scores is not mlx_ops.coupled_scores:
        from mlxspec.torchpath import ops as torch_ops

        backend_sample, backend_split = torch_ops.sample, torch_ops.split
    params = SamplingParams(temperature=0.8, min_p=0.05, coupled=True)
    raw = np.random.default_rng(4).normal(size=(5, 40)).astype(np.float32)
    key = CoupledKey(seed=9, position=30)
    assert backend_split(key, 3) == [CoupledKey(9, 30), CoupledKey(9, 31), CoupledKey(9, 32)]
    target = numpy(scores(array(raw), params, 9, range(30, 35))).argmax(-1)
    rows = numpy(backend_sample(array(raw), params, key))
    one_by_one = [int(numpy(backend_sample(array(raw[i]), params, sub))) for i, sub in enumerate(backend_split(key, 5))]
    assert rows.tolist() == target.tolist() == one_by_one
    assert numpy(backend_sample(array(raw), params, CoupledKey(10, 30))).tolist() != target.tolist()
