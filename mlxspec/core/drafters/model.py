"""A draft model with its own KV cache; ``self:L`` is the target's own first L layers."""

from __future__ import annotations

from typing import Any

from mlxspec.core.cache import check_trimmable, common_prefix, rewind
from mlxspec.core.drafters.base import (Commit, Proposal, auto_proposal, child_picks, grow_tree, no_draft,
                                         processed_row)
from mlxspec.core.ops import ops_for
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import GrowingTree, TreeShape, levels, node_mask


class ModelDrafter:
    """A draft model with its own trimmable KV cache, on the model's backend (``ops``).

    Invariant: the cache holds every committed token except ``pending`` (one token, or two
    after a fully accepted draft, whose last token was never fed). Proposing feeds
    ``pending`` and then ``fed`` drafts (all but the last of a chain, all but the last level
    of a tree, the expanded nodes of an auto tree), proposal node i at cache row
    ``fed_rows[i]`` after pending; the commit keeps those of them the target accepted. ``committed`` is every
    committed token, so a new prompt that starts the same way (the next chat turn) reuses
    the cache for the shared part."""

    samples_children = True  # --tree DxB:sample
    wants_hidden = False

    def __init__(self, model: Any, name: str, num_layers: int | None = None):
        self.model, self.name, self.num_layers = model, name, num_layers
        self.ops = ops_for(model)
        self.cache: list = []
        self.pending: list[int] = []
        self.fed = 0
        self.fed_rows: dict[int, int] = {}
        self.committed: list[int] = []

    def _forward(self, tokens: Any) -> Any:
        return self.model(tokens.reshape(1, -1), self.cache, num_layers=self.num_layers)[0, -1]

    def reset(self, prompt: list[int], hidden: Any = None) -> None:
        held = self.committed[: len(self.committed) - len(self.pending)]
        n = common_prefix(held, prompt[:-1])
        if self.cache and n and self.cache[0].offset == len(held):  # else a step failed halfway: start afresh
            rewind(self.cache, len(held) - n)
        else:
            self.cache, n = check_trimmable(self.model.make_cache()[: self.num_layers], f"draft {self.name!r}"), 0
        if len(prompt) - 1 > n:
            self.ops.prefill(self.model, self.cache, prompt[n:-1], num_layers=self.num_layers)
            self.ops.evaluate([c.state for c in self.cache])
        self.pending, self.committed = prompt[-1:], list(prompt)

    def propose(self, history: list[int], k: int, params: SamplingParams, key: Any) -> Proposal:
        ops = self.ops
        if k == 0:
            return no_draft(ops)
        logits = self._forward(ops.tokens(self.pending))
        tokens, dists = [], []
        for i, sub in enumerate(ops.split(key, k)):
            logits = processed_row(ops, logits, params, history, tokens)
            if not params.greedy:
                dists.append(ops.probs(logits, params))
            tokens.append(ops.sample(logits, params, sub))
            if i < k - 1:
                logits = self._forward(tokens[-1])
        self.fed, self.fed_rows = k - 1, {i: i for i in range(k - 1)}
        return Proposal(ops.stack(tokens), ops.stack(dists) if dists else None)

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: Any,
                     draft_probs: bool = False) -> Proposal:
        """Each node's top-``shape.branch`` children by the draft's logits (or, for a sampled
        shape at T > 0, ``branch`` draws from its distribution, which become the proposal's q),
        one forward pass per level (a level's nodes see the committed tokens and their own
        ancestors)."""
        ops = self.ops
        if shape.auto:
            return self._propose_auto(shape, params, draft_probs)
        parents = shape.parents()
        if not parents:
            return no_draft(ops)
        logits = self._forward(ops.tokens(self.pending))[None]
        base = self.cache[0].offset  # where the first level goes
        tokens, qs, dists, previous = [], [], [], None
        by_level = levels(parents)
        keys = ops.split(key, len(by_level)) if shape.sampled and not params.greedy else None
        for depth, level in enumerate(by_level, start=1):
            rows, ranks = (ops.tokens(x) for x in child_picks(parents, level, previous))
            if keys is None:
                tokens.append(ops.top_children(logits, shape.branch)[rows, ranks])
            else:
                picks, q = ops.sample_children(logits, shape.branch, params, keys[depth - 1])
                tokens.append(picks[rows, ranks])
                dists.append(q[rows])
            if draft_probs:
                qs.append(ops.node_probs(logits, rows, tokens[-1], params))
            if depth < len(by_level):  # the last level is never fed, as a chain's last draft
                mask = ops.from_numpy(node_mask(parents, base, level.start, level.stop))
                positions = ops.tokens([base + depth - 1] * len(level))
                logits = self.model(tokens[-1][None], self.cache, mask=mask, positions=positions,
                                    num_layers=self.num_layers)[0]
            previous = level
        self.fed = by_level[-1].start
        self.fed_rows = {i: i for i in range(self.fed)}
        return Proposal(ops.concatenate(tokens), ops.concatenate(dists) if dists else None, parents,
                        ops.concatenate(qs) if qs else None)

    def _propose_auto(self, shape: TreeShape, params: SamplingParams, draft_probs: bool) -> Proposal:
        """An auto tree (``grow_tree``): each level's most likely nodes run in one pass, each
        seeing the committed tokens and its own ancestors."""
        ops = self.ops
        root = self._forward(ops.tokens(self.pending))[None]
        base = self.cache[0].offset

        def expand(ids: list[int], tree: GrowingTree) -> Any:
            mask = ops.from_numpy(tree.feed_mask(ids, base))
            positions = ops.tokens([base + tree.depth[i] - 1 for i in ids])
            return self.model(ops.tokens([tree.tokens[i] for i in ids])[None], self.cache, mask=mask,
                              positions=positions, num_layers=self.num_layers)[0]

        tree = grow_tree(shape, root, expand, params, ops)
        proposal, chosen = auto_proposal(tree, shape, draft_probs, ops)
        row = {node: r for r, node in enumerate(tree.fed)}
        self.fed, self.fed_rows = len(tree.fed), {j: row[n] for j, n in enumerate(chosen) if n in row}
        return proposal

    def commit(self, commit: Commit) -> None:
        drafted = commit.drafted
        self.committed += commit.committed
        if not drafted:  # nothing was proposed, so pending was not fed either
            self.pending.append(commit.next_token)
            return
        # The cache gained pending + the fed drafts; keep pending + the accepted fed ones.
        path = commit.accepted_nodes
        self.ops.keep_rows(self.cache, self.cache[0].offset - self.fed, [self.fed_rows[i] for i in path if i in self.fed_rows])
        unfed = [drafted[path[-1]]] if path and path[-1] not in self.fed_rows else []
        self.pending = unfed + [commit.next_token]
