"""Logits -> the distribution a model actually samples from.

Speculative sampling is exact only if p and q are the *processed* distributions (temperature,
top-k, top-p, min-p applied), so the same function serves plain sampling, drafting and
verification. The filters are mlx-lm's; they work on any leading shape (..., V).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxspec.errors import MlxspecError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):  # also refuses NaN
            raise MlxspecError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise MlxspecError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise MlxspecError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise MlxspecError(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logprobs(logits: mx.array, params: SamplingParams) -> mx.array:
    """Normalised log-probabilities of the processed distribution, float32, shape of logits."""
    lp = logits.astype(mx.float32)
    if not params.greedy:
        lp = lp / params.temperature
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    if params.greedy:
        return lp
    filtered = False
    if 0 < params.top_k < lp.shape[-1]:
        lp, filtered = apply_top_k(lp, params.top_k), True
    if params.top_p < 1:
        lp, filtered = apply_top_p(lp, params.top_p), True
    if params.min_p > 0:
        lp, filtered = apply_min_p(lp, params.min_p), True
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True) if filtered else lp


def probs(logits: mx.array, params: SamplingParams) -> mx.array:
    return mx.exp(logprobs(logits, params))


def sample(logits: mx.array, params: SamplingParams, key: mx.array | None) -> mx.array:
    """One token per row of ``logits`` (int32), argmax when greedy."""
    if params.greedy:
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    return mx.random.categorical(logprobs(logits, params), key=key).astype(mx.int32)


def top_children(logits: mx.array, branch: int) -> mx.array:
    """(n, V) logits -> (n, branch) the most likely tokens of each row, best first, distinct."""
    top = mx.argpartition(-logits, kth=branch - 1, axis=-1)[:, :branch]
    order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
    return mx.take_along_axis(top, order, axis=-1).astype(mx.int32)


def sample_children(logits: mx.array, branch: int, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array]:
    """(n, V) logits -> (n, branch) children drawn independently from each row's sampling
    distribution (repeats possible), and those distributions (n, V): a tree's q."""
    lp = logprobs(logits, params)
    return mx.random.categorical(lp, num_samples=branch, key=key).astype(mx.int32), mx.exp(lp)


def node_probs(logits: mx.array, rows: mx.array, picked: mx.array, params: SamplingParams) -> mx.array:
    """The probability of each picked child under its parent's row of ``logits``: the softmax
    when greedy, the sampling distribution otherwise (as ``NodeStats``)."""
    lp = logprobs(logits, params)  # at T = 0: the softmax
    return mx.exp(lp[rows, picked])


def child_logprobs(logits: mx.array, top: mx.array, params: SamplingParams) -> mx.array:
    """(n, V) logits, (n, B) picked columns -> (n, B) each pick's log-probability under its
    row: the softmax when greedy, the sampling distribution otherwise (-inf where filtered)."""
    lp = logprobs(logits, params)  # at T = 0: the softmax
    return mx.take_along_axis(lp, top.astype(mx.int32), axis=-1)
