"""Prompt processing: the prompt goes through the model in chunks, so long prompts never build
one huge attention graph."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.core.target import Target

PREFILL_CHUNK = 512


def prefill(
    model: Target, cache: list, tokens: list[int], num_layers: int | None = None, return_hidden: bool = False
) -> mx.array | tuple[mx.array, mx.array]:
    """Run the prompt through ``model`` in chunks; return the logits of the last position and,
    with ``return_hidden``, the hidden states of every position (L, D)."""
    # Models that cannot return hidden states (a trained draft) are never asked to.
    kw = {"return_hidden": True} if return_hidden else {}
    hidden = []
    for start in range(0, len(tokens) - PREFILL_CHUNK, PREFILL_CHUNK):
        out = model(mx.array([tokens[start : start + PREFILL_CHUNK]]), cache, num_layers=num_layers, **kw)
        if return_hidden:
            hidden.append(out[1][0])
        mx.eval([c.state for c in cache], hidden)
    tail = len(tokens) - (len(tokens) - 1) % PREFILL_CHUNK - 1
    out = model(mx.array([tokens[tail:]]), cache, num_layers=num_layers, **kw)
    if not return_hidden:
        return out[0, -1]
    logits, h = out
    return logits[0, -1], mx.concatenate(hidden + [h[0]])
