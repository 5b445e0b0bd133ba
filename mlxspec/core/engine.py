"""The decoding loop. Yields ``Step`` events as tokens are committed, then one ``Done``.

MLX is lazy: each step builds its graph and the host waits once, for the values the next
decision needs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx

from mlxspec.core.drafters import Drafter, parse_k
from mlxspec.core.events import Done, Event, Status, Step, Token
from mlxspec.core.model import Llama
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams, probs, sample
from mlxspec.core.verify import greedy_verify, rejection_verify
from mlxspec.errors import MlxspecError


def _token_budget(prompt: list[int], max_tokens: int, context: int) -> tuple[int, str]:
    """How many tokens may be generated, and the stop reason once that many are."""
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")
    if not prompt:
        raise MlxspecError("the prompt is empty")
    if len(prompt) >= context:
        raise MlxspecError(f"prompt is {len(prompt)} tokens; the model's context is {context}")
    limit = min(max_tokens, context - len(prompt))
    return limit, "length" if limit == max_tokens else "context"


def generate_plain(
    model: Llama,
    prompt: list[int],
    params: SamplingParams,
    max_tokens: int,
    stop_ids: set[int],
    context: int,
    seed: int = 0,
) -> Iterator[Event]:
    """Target-only decoding. The next token is computed while the host handles the current one
    (``async_eval``), as mlx-lm does; the one extra step at the end is discarded."""
    limit, at_limit = _token_budget(prompt, max_tokens, context)
    cache = model.make_cache()
    key = mx.random.key(seed)

    def step(logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
        if params.greedy:  # no randomness: skip the key split and its evaluation
            return sample(logits, params, None), key
        key, sub = mx.random.split(key)
        return sample(logits, params, sub), key

    t0 = time.perf_counter()
    y, key = step(prefill(model, cache, prompt), key)
    mx.async_eval(y, key)
    n, reason, t_first, t_prev = 0, at_limit, None, None
    while n < limit:
        nxt, key = step(model(y.reshape(1, 1), cache)[0, -1], key)
        mx.async_eval(nxt, key)
        tok = y.item()
        now = time.perf_counter()
        if t_first is None:
            t_first = t_prev = now
        if tok in stop_ids:
            reason = "eos"
            break
        n += 1
        yield Step([Token(tok, Status.PLAIN)], k=0, accepted=0, draft_ms=0.0, verify_ms=(now - t_prev) * 1e3)
        t_prev = now
        y = nxt
    end = time.perf_counter()
    mx.synchronize()  # the speculative next step is still running; finish it before we return
    yield Done(len(prompt), n, prefill_s=t_first - t0, decode_s=end - t_first, stop_reason=reason, steps=n)


def _pad_vocab(q: mx.array | None, vocab: int) -> mx.array | None:
    """Draft and target may pad their embedding tables differently; tokens beyond the
    smaller table have probability 0 there."""
    if q is None or q.shape[-1] == vocab:
        return q
    if q.shape[-1] > vocab:
        return q[:, :vocab]
    return mx.concatenate([q, mx.zeros((q.shape[0], vocab - q.shape[-1]), q.dtype)], axis=-1)


def generate(
    model: Llama,
    prompt: list[int],
    params: SamplingParams,
    max_tokens: int,
    stop_ids: set[int],
    context: int,
    seed: int = 0,
    drafter: Drafter | None = None,
    k: int = 4,
) -> Iterator[Event]:
    """Speculative decoding with ``drafter`` (target-only decoding without one).

    Invariant: the target cache holds every committed token but the last, ``y``. A step feeds
    [y, d_1..d_m] in one pass; row i of its logits judges d_{i+1} and row m gives the bonus.
    """
    if drafter is None:
        yield from generate_plain(model, prompt, params, max_tokens, stop_ids, context, seed)
        return
    limit, reason = _token_budget(prompt, max_tokens, context)
    k = parse_k(k)
    t0 = time.perf_counter()
    cache = model.make_cache()
    if len(prompt) > 1:
        prefill(model, cache, prompt[:-1])
        mx.eval([c.state for c in cache])
    drafter.reset(prompt)
    history, y = list(prompt), prompt[-1]
    key = mx.random.key(seed)
    emitted, steps, accepted_lengths = 0, 0, []
    t_first = None

    while emitted < limit:
        key, draft_key, verify_key = mx.random.split(key, 3)
        # Never draft past what may still be emitted: the verify pass adds one token itself.
        room = min(k, limit - emitted - 1)

        t_step = time.perf_counter()
        draft, q = drafter.propose(history, room, params, draft_key)
        mx.eval(draft, q)  # a sync of its own only so draft and verify time are reported apart
        t_drafted = time.perf_counter()

        logits = model(mx.concatenate([mx.array([y], mx.int32), draft])[None], cache)[0]
        if params.greedy:
            n_acc, nxt = greedy_verify(draft, logits)
        else:
            p = probs(logits, params)
            n_acc, nxt = rejection_verify(draft, _pad_vocab(q, p.shape[-1]), p, verify_key)
        mx.eval(n_acc, nxt)
        t_verified = time.perf_counter()

        drafted, n, y = draft.tolist(), n_acc.item(), nxt.item()
        for c in cache:
            c.trim(len(drafted) - n)
        drafter.commit(drafted, n, y)
        committed = drafted[:n] + [y]
        history += committed
        steps += 1
        accepted_lengths.append(n)

        last = Status.PLAIN if not drafted else Status.CORRECTED if n < len(drafted) else Status.BONUS
        status = [Status.ACCEPTED] * n + [last]
        tokens: list[Token] = []
        stop = False
        for tok, st in zip(committed, status):
            if tok in stop_ids:
                stop, reason = True, "eos"
                break
            tokens.append(Token(tok, st))
            emitted += 1
            if emitted == limit:
                break
        if n < len(drafted) and len(tokens) > n:  # show refused drafts just before the correction
            tokens[n:n] = [Token(d, Status.REJECTED) for d in drafted[n:]]
        if t_first is None:
            t_first = t_verified
        yield Step(tokens, k=len(drafted), accepted=n,
                   draft_ms=(t_drafted - t_step) * 1e3, verify_ms=(t_verified - t_drafted) * 1e3, room=room)
        if stop:
            break

    end = time.perf_counter()
    yield Done(len(prompt), emitted, prefill_s=(t_first or end) - t0, decode_s=end - (t_first or end),
               stop_reason=reason, steps=steps, accepted_lengths=accepted_lengths)
