"""Drafters: who proposes the K tokens the target verifies.

One protocol, three kinds:
* ``ModelDrafter``: any model with a compatible tokenizer, with its own KV cache;
  ``self:L`` is the target's own first L layers plus its final norm and head.
* ``NgramDrafter``: prompt lookup, no weights; deterministic, so its q is a point mass.
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import RotatingKVCache

from .errors import MlxspecError
from .model import Llama
from .sampling import SamplingParams, probs, sample

MAX_K = 64


class Drafter(Protocol):
    name: str

    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence whose committed tokens are ``prompt``."""

    def propose(self, history: list[int], k: int, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array | None]:
        """Up to ``k`` draft tokens after ``history`` (int32, lazy) and the probabilities they
        were sampled from, (k, V), or None for a deterministic drafter."""

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        """The target kept ``drafted[:accepted]`` then emitted ``next_token``: roll back to that."""


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
        from .engine import prefill

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


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = N down to
    ``min_n``) in prompt + output and propose what followed it. Pays when the answer copies
    its input. Single-token matches are mostly noise and each wasted proposal costs a wider
    verify pass, so by default a match needs two tokens (measured in BENCHMARKS.md)."""

    def __init__(self, n: int = 3, min_n: int | None = None):
        if not 1 <= n <= 16:
            raise MlxspecError(f"ngram size must be in 1..16, got {n}")
        self.n, self.min_n, self.name = n, min(2, n) if min_n is None else min_n, f"ngram:{n}"

    def reset(self, prompt):
        pass

    def propose(self, history, k, params, key):
        h = np.asarray(history, dtype=np.int64)
        for n in range(min(self.n, len(h) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)
            hits = np.flatnonzero((windows == h[-n:]).all(axis=1))
            if hits.size:
                start = hits[-1] + n
                return mx.array(h[start : start + k], dtype=mx.int32), None
        return mx.zeros((0,), mx.int32), None

    def commit(self, drafted, accepted, next_token):
        pass


def _float_dtype(target) -> mx.Dtype:
    """A trained draft runs in float16 beside a quantized (GPU) or half target, else float32."""
    return {"float16": mx.float16, "bfloat16": mx.bfloat16, "quantized": mx.float16}.get(target.dtype, mx.float32)


def parse_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise MlxspecError(f"--k must be in 1..{MAX_K}, got {k}")
    return k


DEFAULT_FALLBACK = "ngram:3"  # for targets the registry ships no draft for


def make_drafter(spec: str, target, dtype: str = "auto") -> Drafter | None:
    """``default``, ``none``, ``ngram[:N]``, ``self:L``, a registry draft name, a trained
    draft folder or a draft model path (``LoadedModel`` target)."""
    from . import store

    if spec in ("none", ""):
        return None
    if spec == "default":
        name = store.default_draft(target.name)
        return make_drafter(name or DEFAULT_FALLBACK, target, dtype)
    if spec == "ngram" or spec.startswith("ngram:"):
        n = spec.partition(":")[2] or "3"
        if not n.isdigit():
            raise MlxspecError(f"bad drafter {spec!r}: expected ngram:N with N an integer")
        return NgramDrafter(int(n))
    if spec.startswith("self:"):
        layers = spec.partition(":")[2]
        total = target.config.num_layers
        if not layers.isdigit() or not 1 <= int(layers) < total:
            raise MlxspecError(f"bad drafter {spec!r}: self:L needs 1 <= L < {total} (the target's layers)")
        return ModelDrafter(target.model, spec, num_layers=int(layers))
    from .draft import find_draft, load_draft
    from .loading import check_compatible, load

    folder = find_draft(spec)
    if folder is not None:
        return ModelDrafter(load_draft(folder, target, _float_dtype(target)), spec)
    draft = load(spec, dtype)
    check_compatible(target.tokenizer, draft.tokenizer)
    return ModelDrafter(draft.model, draft.name)
