"""Prompt lookup: drafts copied from earlier in the sequence, no weights."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from mlxspec.core import ops as mlx_ops
from mlxspec.core.drafters.base import Commit, Proposal, no_draft
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import TreeShape
from mlxspec.errors import MlxspecError


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = N down to
    ``min_n``) in prompt + output and propose what followed it. Pays when the answer copies
    its input. Single-token matches are mostly noise and each wasted proposal costs a wider
    verify pass, so by default a match needs two tokens."""

    wants_hidden = False
    commits_any = True  # nothing of its state depends on what it proposed
    draft_prior_ratio = 0.01  # a lookup costs next to nothing beside a target pass

    def __init__(self, n: int = 3, min_n: int | None = None, ops: ModuleType = mlx_ops):
        if not 1 <= n <= 16:
            raise MlxspecError(f"ngram size must be in 1..16, got {n}")
        self.n, self.min_n, self.name = n, min(2, n) if min_n is None else min_n, f"ngram:{n}"
        self.ops = ops  # the target's backend: its arrays are what the engine concatenates
        self.history: list[int] = []  # the committed text, for ``upcoming_source``
        self._upcoming: int | None = None
        self.used_source = 0

    def reset(self, prompt: list[int], hidden: Any = None) -> None:
        self.history = list(prompt)
        self._upcoming = None

    @property
    def sources(self) -> tuple[str, ...]:
        """A match of each length, longest first: a longer one is kept far more often (on the
        default target a 3-token match's first draft 0.73-0.75 of the time, a 2-token one's
        0.39-0.55: ``benchmarks/results/k-by-source.json``)."""
        if self.n == self.min_n:
            return (self.name,)
        return tuple(f"{self.name} matching {n}" for n in range(self.n, self.min_n - 1, -1))

    def _latest_match(self, h: np.ndarray) -> tuple[int, int] | None:
        """Where the continuation of the latest earlier occurrence of the longest matching tail
        starts, and that tail's length. One pass over the history finds the earlier copies of the
        last token; the tokens before them are checked only there (a step's lookup: ~20 us, not
        ~100)."""
        ends = np.flatnonzero(h[:-1] == h[-1])  # where an earlier copy of the last token is
        for n in range(min(self.n, len(h) - 1), self.min_n - 1, -1):
            found = ends[ends >= n - 1]
            for back in range(1, n):
                found = found[h[found - back] == h[-1 - back]]
            if found.size:
                return int(found[-1]) + 1, n
        return None

    def _source(self, match: tuple[int, int] | None) -> int:
        return 0 if self.n == self.min_n else self.n - (match[1] if match else self.min_n)

    def offers(self, history: list[int]) -> bool:
        """Whether ``propose`` would draft anything after ``history`` (a cascade asks first)."""
        return self._latest_match(np.asarray(history, dtype=np.int64)) is not None

    def upcoming_source(self) -> int:
        """The source (``sources``) of the next draft after the committed text."""
        if self._upcoming is None:
            h = np.asarray(self.history, dtype=np.int64)
            self._upcoming = self._source(self._latest_match(h) if h.size else None)
        return self._upcoming

    def propose(self, history: list[int], k: int, params: SamplingParams, key: Any) -> Proposal:
        if k == 0:
            return no_draft(self.ops)
        h = np.asarray(history, dtype=np.int64)
        match = self._latest_match(h)
        self.used_source = self._source(match)
        if match is None:
            return no_draft(self.ops)
        return Proposal(self.ops.tokens(h[match[0] : match[0] + k]))

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: Any,
                     draft_probs: bool = False) -> Proposal:
        """Up to ``shape.branch`` different continuations of earlier matches (longest, then
        latest first), each up to ``shape.depth`` tokens, merged where they agree (a trie),
        at most ``shape.max_nodes`` nodes. No probabilities: ``draft_probs`` gives nothing."""
        tokens: list[int] = []
        parents: list[int] = []
        node_of: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for continuation in self._continuations(history, shape.depth, shape.branch):
            parent = -1
            for tok in continuation:
                node = node_of.get((parent, tok))
                if node is None:
                    if len(tokens) == shape.max_nodes:
                        break
                    node = node_of[(parent, tok)] = len(tokens)
                    tokens.append(tok)
                    parents.append(parent)
                parent = node
        if not tokens:
            return no_draft(self.ops)
        return Proposal(self.ops.tokens(tokens), None, tuple(parents))

    def _continuations(self, history: list[int], length: int, count: int) -> list[tuple[int, ...]]:
        h = np.asarray(history, dtype=np.int64)
        found: list[tuple[int, ...]] = []
        if length == 0:
            return found
        for n in range(min(self.n, len(h) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)
            for start in np.flatnonzero((windows == h[-n:]).all(axis=1))[::-1] + n:
                continuation = tuple(h[start : start + length].tolist())
                if continuation not in found:
                    found.append(continuation)
                if len(found) == count:
                    return found
        return found

    def commit(self, commit: Commit) -> None:
        self.history += commit.committed
        self._upcoming = None
