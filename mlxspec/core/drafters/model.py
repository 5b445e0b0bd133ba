"""A draft model with its own KV cache; ``self:L`` is the target's own first L layers."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.core.cache import check_trimmable, common_prefix, keep_rows, rewind
from mlxspec.core.drafters.base import NO_DRAFT, Commit, Proposal, child_picks, node_probs, top_children
from mlxspec.core.model import Llama
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams, probs, sample
from mlxspec.core.tree import TreeShape, levels, node_mask


class ModelDrafter:
    """A draft model with its own trimmable KV cache.

    Invariant: the cache holds every committed token except ``pending`` (one token, or two
    after a fully accepted draft, whose last token was never fed). Proposing feeds
    ``pending`` and then ``fed`` drafts (all but the last of a chain, all but the last level
    of a tree); the commit keeps those of them the target accepted. ``committed`` is every
    committed token, so a new prompt that starts the same way (the next chat turn) reuses
    the cache for the shared part."""

    wants_hidden = False

    def __init__(self, model: Llama, name: str, num_layers: int | None = None):
        self.model, self.name, self.num_layers = model, name, num_layers
        self.cache: list = []
        self.pending: list[int] = []
        self.fed = 0
        self.committed: list[int] = []

    def _forward(self, tokens: mx.array) -> mx.array:
        return self.model(tokens.reshape(1, -1), self.cache, num_layers=self.num_layers)[0, -1]

    def reset(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        held = self.committed[: len(self.committed) - len(self.pending)]
        n = common_prefix(held, prompt[:-1])
        if self.cache and n and self.cache[0].offset == len(held):  # else a step failed halfway: start afresh
            rewind(self.cache, len(held) - n)
        else:
            self.cache, n = check_trimmable(self.model.make_cache()[: self.num_layers], f"draft {self.name!r}"), 0
        if len(prompt) - 1 > n:
            prefill(self.model, self.cache, prompt[n:-1], num_layers=self.num_layers)
            mx.eval([c.state for c in self.cache])
        self.pending, self.committed = prompt[-1:], list(prompt)

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
        self.fed = k - 1
        return Proposal(mx.stack(tokens), mx.stack(dists) if dists else None)

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: mx.array,
                     draft_probs: bool = False) -> Proposal:
        """Each node's top-``shape.branch`` children by the draft's logits, one forward pass
        per level (a level's nodes see the committed tokens and their own ancestors)."""
        parents = shape.parents()
        if not parents:
            return NO_DRAFT
        logits = self._forward(mx.array(self.pending))[None]
        base = self.cache[0].offset  # where the first level goes
        tokens, qs, previous = [], [], None
        by_level = levels(parents)
        for depth, level in enumerate(by_level, start=1):
            rows, ranks = child_picks(parents, level, previous)
            tokens.append(top_children(logits, shape.branch)[rows, ranks])
            if draft_probs:
                qs.append(node_probs(logits, rows, tokens[-1], params))
            if depth < len(by_level):  # the last level is never fed, as a chain's last draft
                mask = mx.array(node_mask(parents, base, level.start, level.stop))
                positions = mx.full((len(level),), base + depth - 1, mx.int32)
                logits = self.model(tokens[-1][None], self.cache, mask=mask, positions=positions,
                                    num_layers=self.num_layers)[0]
            previous = level
        self.fed = by_level[-1].start
        return Proposal(mx.concatenate(tokens), None, parents, mx.concatenate(qs) if qs else None)

    def commit(self, commit: Commit) -> None:
        drafted = commit.drafted
        self.committed += [drafted[i] for i in commit.accepted_nodes] + [commit.next_token]
        if not drafted:  # nothing was proposed, so pending was not fed either
            self.pending.append(commit.next_token)
            return
        # The cache gained pending + the fed drafts; keep pending + the accepted fed ones.
        path = commit.accepted_nodes
        keep_rows(self.cache, self.cache[0].offset - self.fed, [i for i in path if i < self.fed])
        unfed = [drafted[path[-1]]] if path and path[-1] >= self.fed else []
        self.pending = unfed + [commit.next_token]
