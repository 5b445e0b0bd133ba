"""Prompt processing: the prompt goes through the model in chunks, so long prompts never build
one huge attention graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxspec.core.target import Target

PREFILL_CHUNK = 512


class Interrupted(Exception):
    """A prefill stopped between chunks because its caller asked (``stop``). The cache then
    holds the prompt's first ``done`` ids (whole chunks), and ``hidden`` their hidden states when
    they were asked for: a prefix worth keeping, so that the same prompt sent again (a client's
    retry) starts where this one stopped."""

    def __init__(self, done: int = 0, hidden: Any = None):
        super().__init__(f"prefill stopped after {done} tokens")
        self.done, self.hidden = done, hidden


def prefill(
    model: Target, cache: list, ids: list[int], num_layers: int | None = None,
    return_hidden: bool | tuple[int, ...] = False, stop: Callable[[], bool] | None = None,
) -> mx.array | tuple[mx.array, mx.array]:
    """Run the prompt ``ids`` through ``model`` in chunks; return the logits of the last
    position and, with ``return_hidden``, the hidden states of every position (L, D), or of
    the blocks it names (``Target``). ``stop``: asked after each chunk; True raises ``Interrupted``."""
    return chunked(model, cache, ids, num_layers, return_hidden, lambda chunk: mx.array([chunk], mx.int32),
                   mx.concatenate, lambda cache, hidden: mx.eval([c.state for c in cache], hidden), stop)


def chunked(model: Any, cache: list, ids: list[int], num_layers: int | None, return_hidden: bool | tuple[int, ...],
            batch: Callable[[list[int]], Any], concatenate: Callable[[list[Any]], Any],
            settle: Callable[[list, list], None] | None = None, stop: Callable[[], bool] | None = None) -> Any:
    """``prefill`` on any backend: ``batch`` makes a (1, n) token array of a chunk,
    ``concatenate`` joins the hidden states, ``settle(cache, hidden)`` (MLX: evaluate) runs after
    each full chunk so a long prompt never builds one huge graph; ``stop`` is asked then too (a
    server's departed client: a long prompt is given up within a chunk, not at its end)."""
    # Models that cannot return hidden states (a trained draft) are never asked to.
    kw = {"return_hidden": return_hidden} if return_hidden else {}
    # A target that can compute only the logits read (an eager one must be told): none of the
    # earlier chunks', the last position's of the last.
    rows = getattr(getattr(model, "capabilities", None), "logit_rows", False)
    earlier, last = ({"logit_rows": 0}, {"logit_rows": 1}) if rows else ({}, {})
    hidden = []
    tail = len(ids) - (len(ids) - 1) % PREFILL_CHUNK - 1  # the last chunk holds 1..PREFILL_CHUNK ids
    for start in range(0, tail, PREFILL_CHUNK):
        out = model(batch(ids[start : start + PREFILL_CHUNK]), cache, num_layers=num_layers, **kw, **earlier)
        if return_hidden:
            hidden.append(out[1][0])
        if settle is not None:
            settle(cache, hidden)
        if stop is not None and stop():
            raise Interrupted(start + PREFILL_CHUNK, concatenate(hidden) if return_hidden else None)
    out = model(batch(ids[tail:]), cache, num_layers=num_layers, **kw, **last)
    if not return_hidden:
        return out[0, -1]
    logits, h = out
    return logits[0, -1], concatenate(hidden + [h[0]])
