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
