"""A draft model with its own KV cache; ``self:L`` is the target's own first L layers."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from mlxspec.core.model import Llama
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import probs, sample
from mlxspec.errors import MlxspecError


class ModelDrafter:
    """A draft model with its own trimmable KV cache.

    Invariant: the cache holds every committed token except ``pending`` (one token, or two
    after a fully accepted draft, whose last token was never fed)."""

    def __init__(self, model: Llama, name: str, num_layers: int | None = None):
        self.model, self.name, self.num_layers = model, name, num_layers
        self.cache: list = []
        self.pending: list[int] = []

    def _make_cache(self) -> list:
        cache = self.model.make_cache()[: self.num_layers]
        # A rotating cache reports itself trimmable until it wraps, then silently is not.
        if not all(c.is_trimmable() and not isinstance(c, RotatingKVCache) for c in cache):
            raise MlxspecError(
                f"draft {self.name!r} uses a cache that cannot be rolled back "
                f"({type(cache[0]).__name__}: rotating or recurrent); speculative decoding needs a trimmable KV cache"
            )
        return cache

    def _forward(self, tokens: mx.array) -> mx.array:
        return self.model(tokens.reshape(1, -1), self.cache, num_layers=self.num_layers)[0, -1]

    def reset(self, prompt: list[int]) -> None:
        self.cache = self._make_cache()
        if len(prompt) > 1:
            prefill(self.model, self.cache, prompt[:-1], num_layers=self.num_layers)
            mx.eval([c.state for c in self.cache])
        self.pending = prompt[-1:]

    def propose(self, history, k, params, key):
        if k == 0:
            return mx.zeros((0,), mx.int32), None
        logits = self._forward(mx.array(self.pending))
        tokens, dists = [], []
        for i, sub in enumerate(mx.random.split(key, k)):
            if not params.greedy:
                dists.append(probs(logits, params))
            tokens.append(sample(logits, params, sub))
            if i < k - 1:
                logits = self._forward(tokens[-1])
        return mx.stack(tokens), (mx.stack(dists) if dists else None)

    def commit(self, drafted, accepted, next_token):
        k = len(drafted)
        if k == 0:
            self.pending.append(next_token)
            return
        # The cache gained pending + drafted[:k-1]; keep pending + drafted[:accepted].
        for c in self.cache:
            c.trim(k - 1 - min(accepted, k - 1))
        self.pending = drafted[k - 1 :] + [next_token] if accepted == k else [next_token]
