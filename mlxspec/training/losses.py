"""Acceptance-aware losses for training a draft model: EAL for greedy verification, WTV for sampling.

Pure MLX functions: no model calls, no I/O. Every loss is differentiable with ``mx.grad`` /
``nn.value_and_grad`` with respect to the draft's logits and returns a scalar mean over the
entries that are trained.

Shapes: ``B`` batch, ``L`` sequence positions, ``V`` the draft's (possibly reduced) vocabulary,
``G`` sampled drafts per context and ``K`` drafted tokens (GRPO). ``mask`` (B, L) is 1.0 where a
position is trained and 0.0 elsewhere (padding, prompt).

Definitions (teacher-forced along the target's own continuation):

* Window expected length. With per-position acceptance ``a_i`` in [0, 1], a window of ``k``
  drafted tokens starting at ``s`` accepts on average ``E_s = sum_{j=1..k} prod_{i=s..s+j-1} a_i``
  tokens. A position past the end of the sequence or with mask 0 has ``a_i = 0``: the window
  stops there, so starts near the end can accept fewer than ``k``.
* EAL (greedy verification): ``a_i = q_i(y*_i)``, the draft's (optionally sharpened) probability
  of the teacher's argmax token. Smooth stand-in for ``1[argmax q_i = y*_i]``.
* WTV (sampling verification at temperature T): ``a_i = beta_i = sum_v min(p_i^T, q_i^T)``
  ``= 1 - TV(p_i^T, q_i^T)``, the acceptance probability of rejection sampling.
* WTV at a min-p > 0 (the chat samples at T = 1, min-p 0.1): p_i^T keeps only the tokens of at
  least ``min_p`` times its largest, renormalised, as the engine's target samples; q is left
  whole, so every column still gets a gradient. The engine filters q alike, so what its drafts
  keep differs from this overlap only through q's dropped tail (mass moved onto q's larger tokens).
* Both losses are ``-(1/k) * mean over trained starts of E_s``, in [-1, 0].
* GRPO: rewards are simulated accepted lengths of sampled drafts; a PPO-style clipped surrogate
  over the positions up to the first rejection, plus a KL penalty to the starting draft.

Sub-normalised teacher convention: the teacher's log-probabilities ``teacher_logp`` are given at
T=1 over the draft's V columns only. Its mass on tokens outside the draft's vocabulary is simply
missing, so ``sum_V exp(teacher_logp) <= 1``. The draft has q = 0 on those tokens, so they never
contribute to ``min(p, q)``: at T=1, ``beta`` computed from the sub-normalised p is exact. At
T != 1 the tempered teacher needs the whole vocabulary's normaliser, which is unknown; we
renormalise over V (drops the tail: over-estimates p inside V when the tail is not negligible,
and makes beta jump by up to the tail mass between T=1 and T near 1).
KL needs a normalised p at every temperature, so ``kl_loss`` always renormalises over V.

The teacher is a fixed target: its inputs are wrapped in ``mx.stop_gradient``. Masked rows are
replaced by zeros before any arithmetic, so padding rows holding inf/NaN cannot leak NaN into
the loss or the gradient. Half-precision inputs are upcast to float32 before the softmaxes.
"""

from __future__ import annotations

import mlx.core as mx

from mlxspec.core import sampling
from mlxspec.core.sampling import SamplingParams


def _float(x: mx.array) -> mx.array:
    # Half-precision softmaxes lose too much for a loss; float32 and float64 are kept.
    if x.dtype in (mx.float16, mx.bfloat16):
        return x.astype(mx.float32)
    return x


def _masked_mean(values: mx.array, mask: mx.array) -> mx.array:
    """Mean of ``values`` over entries where ``mask`` > 0; 0 when nothing is valid."""
    valid = mask > 0
    total = mx.where(valid, values, 0.0).sum()
    count = valid.sum().astype(total.dtype)
    return total / mx.maximum(count, 1.0)


def _sanitise_rows(x: mx.array, mask: mx.array) -> mx.array:
    # Zero the masked rows *before* the softmaxes: a `where` after them would still send a zero
    # cotangent through NaN intermediates, and 0 * NaN is NaN in the backward pass.
    return mx.where((mask > 0)[..., None], _float(x), 0.0)


def temperature_logprobs(logits: mx.array, temp: float) -> mx.array:
    """log_softmax(logits / temp) along the last axis."""
    scaled = _float(logits) / temp
    return scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)


def _window_from_accept(a: mx.array, k: int, mask: mx.array) -> mx.array:
    """E_s from acceptances ``a`` (B, L) in [0, 1]; see ``window_expected_length``."""
    a = mx.where(mask > 0, a, 0.0)
    batch, length = a.shape
    # Shifted running product: after offset j, run[s] = prod_{i=s..s+j} a_i. Products of numbers
    # in [0, 1] cannot overflow, and a zero (mask, end of sequence, underflow) simply ends the
    # window -- unlike differences of a cumulative log-sum, which give -inf - -inf = NaN.
    run = mx.ones_like(a)
    total = mx.zeros_like(a)
    for j in range(min(k, length)):
        shifted = a if j == 0 else mx.concatenate([a[:, j:], mx.zeros((batch, j), a.dtype)], axis=1)
        run = run * shifted
        total = total + run
    return total  # zero where mask == 0 because the first factor a_s is zero there


def window_expected_length(log_a: mx.array, k: int, mask: mx.array) -> mx.array:
    """Expected accepted length of a k-token window starting at every position.

    log_a (B, L): log per-position acceptance along a teacher-forced sequence. For every start s
    with mask[s] == 1, ``E_s = sum_{j=1..k} prod_{i=s..s+j-1} a_i``; positions past the end of the
    sequence or with mask == 0 contribute a_i = 0 (the window stops there). Returns (B, L), 0
    where mask == 0. O(k * L), vectorised; log_a may be very negative or -inf.
    """
    # Masked entries are zeroed before exp() so garbage there cannot reach the gradient.
    return _window_from_accept(mx.exp(mx.where(mask > 0, _float(log_a), 0.0)), k, mask)


def kl_loss(teacher_logp: mx.array, draft_logits: mx.array, temp: float, mask: mx.array) -> mx.array:
    """Forward KL(p^T || q^T) per position, mean over masked positions.

    teacher_logp (B, L, V): the teacher's log-probs at T=1 over V (sub-normalised allowed).
    p^T = softmax(teacher_logp / temp) renormalised over V (approximation: the tail outside V is
    dropped); q^T = softmax(draft_logits / temp).
    """
    log_p = temperature_logprobs(_sanitise_rows(mx.stop_gradient(teacher_logp), mask), temp)
    log_q = temperature_logprobs(_sanitise_rows(draft_logits, mask), temp)
    p = mx.exp(log_p)
    # 0 * log 0 = 0: columns where the teacher has no mass (log p = -inf) contribute nothing.
    has_mass = p > 0
    per_position = (p * (mx.where(has_mass, log_p, 0.0) - log_q)).sum(axis=-1)
    return _masked_mean(per_position, mask)


def eal_loss(
    draft_logits: mx.array, target_ids: mx.array, k: int, mask: mx.array, sharpen: float = 1.0
) -> mx.array:
    """Greedy expected-accepted-length loss.

    a_i = softmax(draft_logits / sharpen)[target_ids_i], where target_ids (B, L) int are the
    teacher's argmax tokens as column indices into V, or -1 where the teacher's argmax is
    outside V (a_i = 0 exactly: that position can never be accepted; no gradient, no NaN).
    Loss = -(1/k) * mean over masked starts of ``window_expected_length``.
    """
    lengths = _window_from_accept(eal_acceptance(draft_logits, target_ids, mask, sharpen), k, mask)
    return -_masked_mean(lengths, mask) / k


def eal_acceptance(
    draft_logits: mx.array, target_ids: mx.array, mask: mx.array, sharpen: float = 1.0
) -> mx.array:
    """(B, L) a_i = softmax(draft_logits / sharpen)[target_ids_i]; 0 for target -1 or mask 0."""
    log_q = temperature_logprobs(_sanitise_rows(draft_logits, mask), sharpen)
    in_vocab = (target_ids >= 0) & (mask > 0)
    index = mx.where(in_vocab, target_ids, 0).astype(mx.int32)[..., None]
    log_a = mx.take_along_axis(log_q, index, axis=-1)[..., 0]
    # Gather a valid column and zero afterwards (not log 0): keeps the backward pass finite.
    return mx.where(in_vocab, mx.exp(log_a), 0.0)


def _tempered_teacher_probs(teacher_logp: mx.array, temp: float, min_p: float = 0.0) -> mx.array:
    """p^T over V for the WTV overlap: exact (sub-normalised) at T=1, renormalised over V else;
    at ``min_p`` > 0 what the chat's sampler draws from (``core.sampling.probs``), over V: a
    kept token outside the head's columns is not seen, so the kept ones are slightly over-weighted."""
    if min_p > 0.0:
        return sampling.probs(teacher_logp, SamplingParams(temp, min_p=min_p))
    if temp == 1.0:
        return mx.exp(teacher_logp)
    return mx.exp(temperature_logprobs(teacher_logp, temp))


def wtv_loss(
    teacher_logp: mx.array, draft_logits: mx.array, temp: float, k: int, mask: mx.array, min_p: float = 0.0
) -> mx.array:
    """Sampling expected-accepted-length loss with beta_i = sum_v min(p_i^T, q_i^T).

    p^T: at temp == 1 the sub-normalised teacher itself, exp(teacher_logp) (exact: its missing
    tail is where q = 0, so min(p, q) is unaffected); at temp != 1 softmax over V of
    teacher_logp / temp (the unknown tail is dropped); filtered at ``min_p`` > 0.
    q^T = softmax(draft_logits / temp).
    Loss = -(1/k) * mean over masked starts of the window expected length of beta.
    """
    lengths = _window_from_accept(wtv_acceptance(teacher_logp, draft_logits, temp, mask, min_p), k, mask)
    return -_masked_mean(lengths, mask) / k


def wtv_acceptance(
    teacher_logp: mx.array, draft_logits: mx.array, temp: float, mask: mx.array, min_p: float = 0.0
) -> mx.array:
    """(B, L) beta_i = sum_v min(p_i^T, q_i^T) as in ``wtv_loss``; 0 where mask == 0."""
    p = _tempered_teacher_probs(_sanitise_rows(mx.stop_gradient(teacher_logp), mask), temp, min_p)
    q = mx.exp(temperature_logprobs(_sanitise_rows(draft_logits, mask), temp))
    return mx.where(mask > 0, mx.minimum(p, q).sum(axis=-1), 0.0)


def fits(draft_logits: mx.array, target_ids: mx.array, top: int) -> mx.array:
    """(B, L) bool: the teacher's argmax (a column of V, -1 outside it) is among the draft's
    ``top`` largest logits. GRIFFIN (arXiv 2502.11018) trains a small draft only where this
    holds: elsewhere the draft cannot fit the token, and chasing it spends capacity."""
    z = mx.stop_gradient(_float(draft_logits))
    kth = mx.topk(z, top, axis=-1).min(axis=-1, keepdims=True)
    at_target = mx.take_along_axis(z, mx.maximum(target_ids, 0).astype(mx.int32)[..., None], axis=-1)
    return (target_ids >= 0) & (at_target >= kth)[..., 0]


def where_fit(accept: mx.array, fit: mx.array) -> mx.array:
    """``accept`` with no gradient at the positions that do not ``fit``: the loss's value is
    unchanged, its gradient comes from the positions the draft can fit."""
    return mx.where(fit, accept, mx.stop_gradient(accept))


def blended_loss(kl: mx.array, other: mx.array, lam: float) -> mx.array:
    """lam * kl + (1 - lam) * other: KL warm-start blended into an acceptance loss."""
    return lam * kl + (1.0 - lam) * other


def kl_weight(
    step: int, total: int, start: float = 1.0, end: float = 0.0, anneal_frac: float = 0.5
) -> float:
    """Linear anneal from ``start`` to ``end`` over the first ``anneal_frac`` of ``total`` steps,
    then constant ``end``."""
    anneal_steps = anneal_frac * total
    if anneal_steps <= 0:
        return float(end)
    t = min(max(step / anneal_steps, 0.0), 1.0)
    return float(start + (end - start) * t)


def simulated_accept_length_greedy(draft_tokens: mx.array, target_argmax: mx.array) -> mx.array:
    """(G, K) int draft tokens and target argmaxes -> (G,) int32 number of leading matches."""
    matches = (draft_tokens == target_argmax).astype(mx.int32)
    return mx.cumprod(matches, axis=-1).sum(axis=-1).astype(mx.int32)


def simulated_accept_length_sampling(p_tok: mx.array, q_tok: mx.array) -> mx.array:
    """Expected accepted length of drafts under rejection sampling.

    p_tok, q_tok (G, K): target and draft probabilities of the drafted tokens.
    Returns (G,) sum_k prod_{i<=k} min(1, p_i / q_i), where min(1, p / q) is taken as 1 whenever
    q <= p, so q = 0 (a token the draft cannot propose) never divides by zero.
    """
    p_tok = _float(p_tok)
    q_tok = _float(q_tok)
    below = q_tok > p_tok  # here q > 0, so p / q is finite and < 1
    ratio = mx.where(below, p_tok / mx.where(below, q_tok, 1.0), 1.0)
    return mx.cumprod(ratio, axis=-1).sum(axis=-1)


def group_advantages(rewards: mx.array, eps: float = 1e-4) -> mx.array:
    """(G,) rewards -> (R - mean R) / (std R + eps), population std (ddof 0)."""
    rewards = _float(rewards)
    centred = rewards - rewards.mean()
    return centred / (mx.sqrt((centred * centred).mean()) + eps)


def grpo_loss(
    new_logp_tok: mx.array,
    old_logp_tok: mx.array,
    advantages: mx.array,
    valid: mx.array,
    ref_kl: mx.array,
    clip: float = 0.2,
    kl_coef: float = 0.02,
) -> mx.array:
    """Clipped policy-gradient loss for the GRPO stage.

    new_logp_tok / old_logp_tok (G, K): log q of the sampled draft tokens under the current and
    the sampling-time draft; advantages (G,); valid (G, K) 1.0 for positions up to and including
    the first rejection, 0 after; ref_kl: scalar KL(current || starting draft) from the caller.
    Returns -mean over valid tokens of min(r A, clip(r, 1 - clip, 1 + clip) A) + kl_coef * ref_kl,
    with r = exp(new - old). The mean is per token over the whole group (not per draft first).
    """
    valid_b = valid > 0
    # Zero the invalid entries first so garbage there cannot reach exp() or the gradient.
    new = mx.where(valid_b, _float(new_logp_tok), 0.0)
    old = mx.where(valid_b, mx.stop_gradient(_float(old_logp_tok)), 0.0)
    adv = mx.stop_gradient(_float(advantages))[:, None]
    ratio = mx.exp(new - old)
    surrogate = mx.minimum(ratio * adv, mx.clip(ratio, 1.0 - clip, 1.0 + clip) * adv)
    return -_masked_mean(surrogate, valid) + kl_coef * ref_kl
