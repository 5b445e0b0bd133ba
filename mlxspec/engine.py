"""The decoding loop. Yields ``Step`` events as tokens are committed, then one ``Done``.

MLX is lazy: each step builds its graph and the host waits once, for the values the next
decision needs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx

from .errors import MlxspecError
from .events import Done, Event, Status, Step, Token
from .model import Llama
from .sampling import SamplingParams, sample

PREFILL_CHUNK = 512


def prefill(model: Llama, cache: list, tokens: list[int]) -> mx.array:
    """Run the prompt through ``model`` in chunks; return the logits of the last position."""
    for start in range(0, len(tokens) - PREFILL_CHUNK, PREFILL_CHUNK):
        model(mx.array([tokens[start : start + PREFILL_CHUNK]]), cache)
        mx.eval([c.state for c in cache])
    tail = len(tokens) - (len(tokens) - 1) % PREFILL_CHUNK - 1
    return model(mx.array([tokens[tail:]]), cache)[0, -1]


def _check(prompt: list[int], max_tokens: int, context: int) -> None:
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")
    if not prompt:
        raise MlxspecError("the prompt is empty")
    if len(prompt) >= context:
        raise MlxspecError(f"prompt is {len(prompt)} tokens; the model's context is {context}")


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
    _check(prompt, max_tokens, context)
    cache = model.make_cache()
    key = mx.random.key(seed)
    limit = min(max_tokens, context - len(prompt))
    at_limit = "length" if limit == max_tokens else "context"

    def step(logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
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
    yield Done(len(prompt), n, prefill_s=t_first - t0, decode_s=end - t_first, stop_reason=reason, steps=n)
