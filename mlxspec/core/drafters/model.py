"""A draft model with its own KV cache; ``self:L`` is the target's own first L layers."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.core.cache import check_trimmable, rewind
from mlxspec.core.drafters.base import NO_DRAFT, Commit, Proposal
from mlxspec.core.model import Llama
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams, probs, sample


class ModelDrafter:
    """A draft model with its own trimmable KV cache.

    Invariant: the cache holds every committed token except ``pending`` (one token, or two
    after a fully accepted draft, whose last token was never fed)."""

    wants_hidden = False

    def __init__(self, model: Llama, name: str, num_layers: int | None = None):
        self.model, self.name, self.num_layers = model, name, num_layers
        self.cache: list = []
        self.pending: list[int] = []

    def _forward(self, tokens: mx.array) -> mx.array:
        return self.model(tokens.reshape(1, -1), self.cache, num_layers=self.num_layers)[0, -1]

    def reset(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        self.cache = check_trimmable(self.model.make_cache()[: self.num_layers], f"draft {self.name!r}")
        if len(prompt) > 1:
            prefill(self.model, self.cache, prompt[:-1], num_layers=self.num_layers)
            mx.eval([c.state for c in self.cache])
        self.pending = prompt[-1:]

    def propose(self, history: list[int], k: int, params: SamplingParams, key: mx.array) -> Proposal:
        if k == 0:
            return NO_DRAFT
        logits = self._forward(mx.array(self.pending))
        tokens, dists = [], []
        for i, sub in enumerate(mx.random.split(key, k)):
            if not params.greedy:
                dists.append(probs(logits, params))
            tokens.append(sample(logits, params, sub))
            if i < k - 1:
                logits = self._forward(tokens[-1])
        return Proposal(mx.stack(tokens), mx.stack(dists) if dists else None)

    def commit(self, commit: Commit) -> None:
        drafted, accepted = commit.drafted, commit.accepted
        k = len(drafted)
        if k == 0:
            self.pending.append(commit.next_token)
            return
        # The cache gained pending + drafted[:k-1]; keep pending + drafted[:accepted].
        rewind(self.cache, k - 1 - min(accepted, k - 1))
        self.pending = drafted[k - 1 :] + [commit.next_token] if accepted == k else [commit.next_token]
