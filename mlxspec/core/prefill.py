"""Prompt processing: the prompt goes through the model in chunks, so long prompts never build
one huge attention graph."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.core.model import Llama

PREFILL_CHUNK = 512


def prefill(model: Llama, cache: list, tokens: list[int], num_layers: int | None = None) -> mx.array:
    """Run the prompt through ``model`` in chunks; return the logits of the last position."""
    for start in range(0, len(tokens) - PREFILL_CHUNK, PREFILL_CHUNK):
        model(mx.array([tokens[start : start + PREFILL_CHUNK]]), cache, num_layers=num_layers)
        mx.eval([c.state for c in cache])
    tail = len(tokens) - (len(tokens) - 1) % PREFILL_CHUNK - 1
    return model(mx.array([tokens[tail:]]), cache, num_layers=num_layers)[0, -1]
