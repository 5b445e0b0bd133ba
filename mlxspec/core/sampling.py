"""Logits -> the distribution a model actually samples from.

Speculative sampling is exact only if p and q are the *processed* distributions (temperature,
top-k, top-p, min-p applied), so the same function serves plain sampling, drafting and
verification. The filters are mlx-lm's; they work on any leading shape (..., V).

``SamplingParams`` also carries the logits processors (penalties, logit bias). Those depend on
the tokens before each position, so they are applied where the prefix is known: the engine runs
``processors.process_logits`` on the target's rows before any of the functions here see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxspec.errors import MlxspecError


MAX_PENALTY = 2.0  # presence and frequency penalties: OpenAI's range [-2, 2]
MAX_BIAS = 100.0  # logit bias: OpenAI's range [-100, 100]
MAX_CONTEXT_SIZE = 4096  # the penalties' windows (mlx-lm's default is 20)
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's bound)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    # mlx-lm's logits processors (``mlx_lm.sample_utils.make_logits_processors``), each over
    # the last ``*_context_size`` tokens of the position's own prefix (prompt included).
    repetition_penalty: float = 1.0  # 1 = off; sign-aware: a seen token's logit x or / this
    repetition_context_size: int = 20
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from each token seen
    presence_context_size: int = 20
    frequency_penalty: float = 0.0  # OpenAI's: subtracted once per occurrence
    frequency_context_size: int = 20
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI's: (token id, added to its logit), ids distinct
    # At T > 0, draw each token by Gumbel-max with noise keyed by (seed, position) (``coupled_scores``):
    # the reply is target-only sampling's for that seed, whatever the drafter and K.
    coupled: bool = False
    # At T > 0, verify a chain sampled from the drafter's q as a block (``verify.block_verify``),
    # which keeps at least as many drafts as token-by-token rejection sampling, equally exact.
    block_verify: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):  # also refuses NaN
            raise MlxspecError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise MlxspecError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise MlxspecError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise MlxspecError(f"min-p must be in [0, 1], got {self.min_p}")
        if not 0 < self.repetition_penalty < float("inf"):
            raise MlxspecError(f"repetition penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty}")
        for name in ("presence", "frequency"):
            value = getattr(self, f"{name}_penalty")
            if not -MAX_PENALTY <= value <= MAX_PENALTY:  # OpenAI's range; also refuses NaN
                raise MlxspecError(f"{name} penalty must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}")
        for name in ("repetition", "presence", "frequency"):
            size = getattr(self, f"{name}_context_size")
            if not 1 <= size <= MAX_CONTEXT_SIZE:
                raise MlxspecError(f"{name} context size must be in 1..{MAX_CONTEXT_SIZE}, got {size}")
        ids = [t for t, _ in self.logit_bias]
        if len(set(ids)) != len(ids) or any(t < 0 for t in ids):
            raise MlxspecError("logit bias token ids must be distinct and >= 0")
        bad = next((b for _, b in self.logit_bias if not -MAX_BIAS <= b <= MAX_BIAS), None)
        if bad is not None:
            raise MlxspecError(f"a logit bias must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got {bad}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filters(self) -> tuple[tuple[str, float], ...]:
        """The filters in force, (name, value) as the command line spells them: top-p, top-k, min-p."""
        return tuple((name, value) for name, value, on in
                     (("top-p", self.top_p, self.top_p < 1), ("top-k", self.top_k, self.top_k > 0),
                      ("min-p", self.min_p, self.min_p > 0)) if on)

    @property
    def filters_label(self) -> str:
        """The filters in force as tables and verdicts name them: " top-p=0.9 min-p=0.1", or ""."""
        return "".join(f" {name}={value:g}" for name, value in self.filters)

    @property
    def label(self) -> str:
        """Temperature, filters, coupling and the chain rule: "T=1 min-p=0.1", "T=1 coupled", "T=1
        block-verified"; "T=0" alone (greedy decoding reads no filter)."""
        if self.greedy:
            return "T=0"
        return (f"T={self.temperature:g}{self.filters_label}{' coupled' if self.coupled else ''}"
                f"{' block-verified' if self.block_verify else ''}")

    @property
    def is_coupled(self) -> bool:
        """Whether tokens are drawn by ``coupled_scores`` (coupling means nothing when greedy)."""
        return self.coupled and not self.greedy

    def for_tree_drafts(self) -> SamplingParams:
        """What a tree's children are picked with: under coupling the drafter's top choices (a
        sampled child would need its own position's noise, and any draft is exact there), else
        these."""
        return replace(self, temperature=0.0) if self.is_coupled else self

    @property
    def processes(self) -> bool:
        """Whether any logits processor is on (off: the engine's path is the plain one)."""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0
                or bool(self.logit_bias))

    @property
    def window(self) -> int:
        """How many of a prefix's last tokens the processors that are on read."""
        sizes = [size for on, size in ((self.repetition_penalty != 1, self.repetition_context_size),
                                       (self.presence_penalty != 0, self.presence_context_size),
                                       (self.frequency_penalty != 0, self.frequency_context_size)) if on]
        return max(sizes, default=1)


GREEDY = SamplingParams()


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


def position_seed(seed: int, position: int) -> int:
    """A 64-bit seed for the draw at ``position`` of a reply sampled with ``seed`` (numpy's
    SeedSequence mixes the two), the same on every backend and in every run."""
    words = np.random.SeedSequence([seed % 2**64, position]).generate_state(2, np.uint32)
    return int(words[0]) << 32 | int(words[1])


@dataclass(frozen=True)
class CoupledKey:
    """The key a drafter gets under coupling: its i-th draft is drawn as the target draws the
    token at ``position + i`` (``coupled_scores``'s noise for that position, on the drafter's q).
    Where q is near p the two argmaxes agree about as often as rejection sampling keeps a draft,
    while the target's draw, and so the reply, still depends on nothing but (seed, position)."""

    seed: int
    position: int

    def split(self, n: int) -> list[CoupledKey]:
        return [CoupledKey(self.seed, self.position + i) for i in range(n)]


def coupled_scores(logits: mx.array, params: SamplingParams, seed: int, positions: Sequence[int]) -> mx.array:
    """(n, V) logits of the tokens at ``positions`` -> their processed log-probabilities plus
    Gumbel noise drawn from (seed, position) alone. A row's argmax is a draw from p (the
    Gumbel-max trick) that depends on nothing but its position, the seed and p: not on how many
    draws or passes came before, nor on any draft. Speculation then keeps a draft exactly where it
    equals that argmax and takes the argmax where it does not, so its reply is target-only
    sampling's with the same seed, for any drafter and K (drafter-invariant coupling, arXiv
    2408.07978), at the cost of accepting only drafts that hit the target's draw."""
    lp = logprobs(logits, params)
    noise = [mx.random.gumbel((lp.shape[-1],), key=mx.random.key(position_seed(seed, p))) for p in positions]
    return lp + mx.stack(noise).astype(lp.dtype)


def sample(logits: mx.array, params: SamplingParams, key: mx.array | CoupledKey | None) -> mx.array:
    """One token per row of ``logits`` (int32), argmax when greedy; with a ``CoupledKey``, row i
    is drawn by the noise of position ``key.position + i``."""
    if params.greedy:
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    if isinstance(key, CoupledKey):
        rows = logits.reshape(-1, logits.shape[-1])
        scores = coupled_scores(rows, params, key.seed, range(key.position, key.position + rows.shape[0]))
        return mx.argmax(scores, axis=-1).astype(mx.int32).reshape(logits.shape[:-1])
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
