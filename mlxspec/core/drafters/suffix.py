"""Suffix lookup: drafts from the target's own history, with observed frequencies, no weights.

The index maps every context of ``min_n``..``n`` tokens seen so far to the counts of the tokens
that followed it, over the current sequence (prompt + committed output) and the sequences of
earlier turns and requests, which it keeps across ``reset`` (a session's drafter serves every
turn) up to a bound on the tokens indexed, the oldest dropped first. A proposal walks the index
like a suffix tree: the longest context that occurred before, its most frequent continuation,
then the same again with that token appended, while the estimated chance that the whole chain so
far is accepted stays above ``min_prob``. Proposals carry no q: verification is exact by the
engine's rules for a deterministic drafter."""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import Any

import numpy as np

from mlxspec.core import ops as mlx_ops
from mlxspec.core.drafters.base import Commit, Proposal, no_draft
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import TreeShape
from mlxspec.errors import MlxspecError

DEFAULT_N = 8
DEFAULT_MAX_TOKENS = 1 << 15  # continuations indexed, all sequences together (~25 MB with n=8)
DEFAULT_MIN_PROB = 0.3
PRIOR = 1.0  # pseudo-observations against every continuation: one sighting reads as 1/2


class _Seq:
    """A sequence in the index: ``tokens[start:]`` are indexed as continuations (their contexts
    may reach back into ``tokens[:start]``, kept for that)."""

    __slots__ = ("start", "tokens")

    def __init__(self, tokens: list[int], start: int = 0):
        self.tokens, self.start = tokens, start

    def __len__(self) -> int:
        return len(self.tokens) - self.start


# A context's continuations: one token seen c times is the int c << TOKEN_BITS | token (most
# contexts of 3+ tokens have one), several are a dict {token: count}, latest seen last. Contexts
# are keyed by their tuple's hash: a 64-bit collision could only cost acceptance, never
# exactness. About 0.7 KB a token indexed with n=8 (dict values and tuple keys took 2.3 KB).
TOKEN_BITS = 24
TOKEN_MASK = (1 << TOKEN_BITS) - 1


def _as_dict(v: int | dict[int, int]) -> dict[int, int]:
    return {v & TOKEN_MASK: v >> TOKEN_BITS} if isinstance(v, int) else v


class SuffixIndex:
    """Counts of next tokens after every context of ``min_n``..``n`` tokens, over sequences
    kept oldest first; ``max_tokens`` bounds the continuations indexed (the oldest go first)."""

    def __init__(self, n: int = DEFAULT_N, min_n: int = 2, max_tokens: int = DEFAULT_MAX_TOKENS):
        if not 1 <= min_n <= n <= 32:
            raise MlxspecError(f"suffix context lengths must satisfy 1 <= min_n <= n <= 32, got {min_n}..{n}")
        if max_tokens < 1:
            raise MlxspecError(f"suffix index bound must be >= 1 token, got {max_tokens}")
        self.n, self.min_n, self.max_tokens = n, min_n, max_tokens
        self.counts: dict[int, int | dict[int, int]] = {}  # hash(context) -> continuations
        self.frozen: deque[_Seq] = deque()  # earlier sequences, oldest first
        self.current = _Seq([])
        self.size = 0  # continuations indexed

    # -- updates

    def _apply(self, seq: list[int], lo: int, hi: int, sign: int) -> None:
        """Add (sign 1) or remove (-1) the continuations ``seq[lo:hi]`` with their contexts."""
        counts, n_lo, n_hi, one = self.counts, self.min_n, self.n, 1 << TOKEN_BITS
        for j in range(lo, hi):
            tok = seq[j]
            for n in range(n_lo, min(n_hi, j) + 1):
                key = hash(tuple(seq[j - n : j]))
                v = counts.get(key)
                if sign > 0:
                    if v is None:
                        counts[key] = one | tok
                    elif isinstance(v, int):
                        counts[key] = v + one if v & TOKEN_MASK == tok else {v & TOKEN_MASK: v >> TOKEN_BITS, tok: 1}
                    else:  # re-inserted: ties go to the latest continuation seen
                        v[tok] = v.pop(tok, 0) + 1
                elif isinstance(v, int):
                    if v >= 2 * one:
                        counts[key] = v - one
                    else:
                        del counts[key]
                else:
                    c = v[tok] - 1
                    if c:
                        v[tok] = c
                    else:
                        del v[tok]
                        if len(v) == 1:
                            ((t, c),) = v.items()
                            counts[key] = c << TOKEN_BITS | t
        self.size += sign * (hi - lo)

    def following(self, context: list[int] | tuple[int, ...]) -> dict[int, int]:
        """The counts of the tokens seen after ``context`` (``min_n``..``n`` tokens)."""
        v = self.counts.get(hash(tuple(context)))
        return {} if v is None else dict(_as_dict(v))

    def extend(self, tokens: list[int]) -> None:
        """The current sequence goes on with ``tokens``."""
        seq = self.current.tokens
        lo = len(seq)
        seq.extend(tokens)
        self._apply(seq, lo, len(seq), 1)
        self._bound()

    def remember(self, tokens: list[int]) -> None:
        """Index ``tokens`` as an earlier sequence (not the current one)."""
        seq = _Seq(list(tokens))
        self._apply(seq.tokens, 0, len(seq.tokens), 1)
        self.frozen.append(seq)
        self._bound()

    def restart(self, prompt: list[int]) -> None:
        """A new current sequence ``prompt``. What it shares with the current one from the start
        (a conversation's earlier turns, a system prompt) stays indexed once; the rest of the
        old current sequence becomes an earlier sequence, counts unchanged."""
        old = self.current
        seq = old.tokens
        common = 0
        limit = min(len(seq), len(prompt))
        while common < limit and seq[common] == prompt[common]:
            common += 1
        if common < len(seq):
            if common <= old.start:  # nothing indexed is shared: the whole sequence is kept as it is
                if len(old):
                    self.frozen.append(old)
                old = _Seq([])
                common = 0
            else:
                tail_from = max(0, common - self.n)
                self.frozen.append(_Seq(seq[tail_from:], common - tail_from))
                del seq[common:]
        self.current = old
        self.extend(list(prompt[common:]))

    def _bound(self) -> None:
        """Drop the oldest continuations beyond ``max_tokens`` (an eighth more, so that a long
        current sequence is not re-sliced every token)."""
        if self.size <= self.max_tokens:
            return
        drop = self.size - self.max_tokens + self.max_tokens // 8
        while drop > 0 and self.size:
            seq = self.frozen[0] if self.frozen else self.current
            if seq is not self.current and not len(seq):
                self.frozen.popleft()
                continue
            cut = min(drop, len(seq))
            self._apply(seq.tokens, seq.start, seq.start + cut, -1)
            drop -= cut
            if seq is not self.current and cut == len(seq):
                self.frozen.popleft()
                continue
            seq.start += cut
            keep_from = max(0, seq.start - self.n)  # contexts of what stays reach back n tokens
            del seq.tokens[:keep_from]
            seq.start -= keep_from

    # -- lookup

    def lookup(self, tail: list[int]) -> tuple[dict[int, int] | None, int]:
        """The continuation counts of the longest suffix of ``tail`` (``min_n``..``n`` tokens)
        seen before, and its length (0 when none)."""
        for n in range(min(self.n, len(tail)), self.min_n - 1, -1):
            v = self.counts.get(hash(tuple(tail[-n:])))
            if v is not None:
                return _as_dict(v), n
        return None, 0

    def ranked(self, tail: list[int], top: int) -> list[tuple[int, float]]:
        """Up to ``top`` continuations of ``tail``'s longest earlier match, most frequent first
        (ties: the latest seen first), each with its estimated chance ``count / (total + PRIOR)``."""
        nxt, _ = self.lookup(tail)
        if not nxt:
            return []
        total = sum(nxt.values()) + PRIOR
        if top == 1:  # the chain's case, without sorting: max keeps the first of equals
            tok, c = max(reversed(nxt.items()), key=lambda kv: kv[1])
            return [(tok, c / total)]
        items = list(nxt.items())[::-1]  # latest first; sorted() is stable
        items.sort(key=lambda kv: -kv[1])
        return [(tok, c / total) for tok, c in items[:top]]


class SuffixDrafter:
    """Suffix lookup over this sequence and earlier ones (``SuffixIndex``): a chain follows the
    most frequent continuation of the longest earlier match token by token while the product of
    their estimated chances stays at or above ``min_prob``; a tree takes the top-B continuations
    at each node. ``remember(tokens)`` adds a sequence by hand; every ``reset`` keeps the previous
    sequence too, so chat turns and server requests that share this drafter share its index."""

    wants_hidden = False
    commits_any = True  # the index holds committed text only
    draft_prior_ratio = 0.01  # a lookup costs next to nothing beside a target pass

    def __init__(self, n: int = DEFAULT_N, min_n: int = 2, max_tokens: int = DEFAULT_MAX_TOKENS,
                 min_prob: float = DEFAULT_MIN_PROB, ops: ModuleType = mlx_ops):
        if not 1 <= n <= 32:
            raise MlxspecError(f"suffix context length must be in 1..32, got {n}")
        if not 0.0 <= min_prob <= 1.0:
            raise MlxspecError(f"suffix min_prob must be in [0, 1], got {min_prob}")
        self.index = SuffixIndex(n, min(min_n, n), max_tokens)
        self.n, self.min_prob, self.name = n, min_prob, f"suffix:{n}"
        self.ops = ops  # the target's backend: its arrays are what the engine concatenates

    @property
    def min_n(self) -> int:
        return self.index.min_n

    @property
    def max_tokens(self) -> int:
        return self.index.max_tokens

    def remember(self, tokens: list[int]) -> None:
        self.index.remember(tokens)

    def reset(self, prompt: list[int], hidden: Any = None) -> None:
        self.index.restart(list(prompt))

    def commit(self, commit: Commit) -> None:
        self.index.extend(commit.committed)

    def _sync(self, history: list[int]) -> None:
        """Follow ``history`` if it is not the current sequence (a caller that skipped ``reset``
        or ``commit``): cheap checks, then a restart."""
        cur = self.index.current.tokens
        if len(cur) != len(history) or (cur and cur[-1] != history[-1]):
            self.index.restart(list(history))

    def offers(self, history: list[int]) -> bool:
        """Whether ``propose`` would draft anything after ``history`` (a cascade asks first)."""
        self._sync(history)
        best = self.index.ranked(list(history[-self.n :]), 1)
        return bool(best) and best[0][1] >= self.min_prob

    def propose(self, history: list[int], k: int, params: SamplingParams, key: Any) -> Proposal:
        self._sync(history)
        tail = list(history[-self.n :])
        out: list[int] = []
        chance = 1.0
        while len(out) < k:
            best = self.index.ranked(tail, 1)
            if not best:
                break
            tok, p = best[0]
            chance *= p
            if chance < self.min_prob:
                break
            out.append(tok)
            tail.append(tok)
        return Proposal(self.ops.tokens(out)) if out else no_draft(self.ops)

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: Any,
                     draft_probs: bool = False) -> Proposal:
        """Breadth first: each node's top-``shape.branch`` continuations (most frequent first),
        down to ``shape.depth``, at most ``shape.max_nodes`` nodes; a node whose path's estimated
        chance falls below ``min_prob`` is left out, as in a chain. ``draft_probs``: each node's estimated chance at its parent."""
        self._sync(history)
        base = list(history[-self.n :])
        tokens: list[int] = []
        parents: list[int] = []
        chances: list[float] = []
        level: list[tuple[int, list[int], float]] = [(-1, base, 1.0)]  # (node, tail, path chance)
        for _ in range(shape.depth):
            nxt_level = []
            for node, tail, chance in level:
                for tok, p in self.index.ranked(tail, shape.branch):
                    if len(tokens) == shape.max_nodes:
                        break
                    if chance * p < self.min_prob:
                        break  # its later siblings are no likelier
                    tokens.append(tok)
                    parents.append(node)
                    chances.append(p)
                    nxt_level.append((len(tokens) - 1, (tail + [tok])[-self.n :], chance * p))
            level = nxt_level
            if not level:
                break
        if not tokens:
            return no_draft(self.ops)
        node_q = self.ops.from_numpy(np.array(chances, np.float32)) if draft_probs else None
        return Proposal(self.ops.tokens(tokens), None, tuple(parents), node_q)
