"""KV-cache rollback, in one place: speculation appends drafts to every cache, then cuts the
rejected ones off again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from mlxspec.errors import MlxspecError


def check_trimmable(cache: Sequence[Any], owner: str, hint: str = "") -> list[Any]:
    """``cache`` if every layer can be rolled back, else a clear error naming ``owner`` (and
    ending in ``hint``, what to do instead).

    A rotating cache reports itself trimmable until it wraps, then silently is not, so it is
    refused up front rather than corrupting a long generation."""
    stuck = [c for c in cache if not c.is_trimmable() or isinstance(c, RotatingKVCache)]
    if stuck:
        raise MlxspecError(
            f"{owner} uses a cache that cannot be rolled back ({type(stuck[0]).__name__}: rotating or "
            f"recurrent); speculative decoding needs a trimmable KV cache{hint}"
        )
    return list(cache)


def rewind(cache: Sequence[Any], n: int) -> None:
    """Forget the last ``n`` tokens of every layer's cache (lazy: no evaluation)."""
    if n > 0:
        for c in cache:
            c.trim(n)


def keep_rows(cache: Sequence[Any], start: int, rows: Sequence[int]) -> None:
    """After a pass over a draft tree, keep of every layer's cache its first ``start`` positions
    followed by positions ``start + r`` for r in ``rows`` (an accepted path: increasing), in
    that order, and forget the rest. Lazy. A chain's accepted prefix is already in place, so
    it only trims, as ``rewind`` does."""
    n = len(rows)
    if list(rows) != list(range(n)):
        idx = mx.array([start + r for r in rows], dtype=mx.int32)
        for c in cache:
            if getattr(c, "keys", None) is None:
                raise MlxspecError(f"cannot compact a {type(c).__name__} after a tree pass (it keeps no key rows)")
            c.keys, c.values = _gathered(c.keys, idx, start), _gathered(c.values, idx, start)
    for c in cache:
        c.trim(c.offset - start - n)


def _gathered(rows: Any, idx: mx.array, start: int) -> Any:
    """Rows ``idx`` of a (..., positions, D) buffer moved to ``start``, ``start + 1``, ... (a
    quantized cache holds a tuple of such buffers)."""
    if isinstance(rows, tuple):
        return tuple(_gathered(r, idx, start) for r in rows)
    rows[..., start : start + idx.size, :] = mx.take(rows, idx, axis=-2)
    return rows


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class PromptCache:
    """A target's KV cache kept from one call to the next (chat turns, server requests), so a
    new prompt that starts like the last conversation only prefills what is new.

    ``tokens`` are the tokens the cache holds, in order; ``hidden`` their hidden states, kept
    only when a drafter that reads them ran (it needs them for the whole prompt), of the kind
    ``hidden_kind`` names (the drafter's ``wants_hidden``: the final state, or those of blocks)."""

    cache: list[Any] | None = None
    tokens: list[int] = field(default_factory=list)
    hidden: mx.array | None = None
    hidden_kind: bool | tuple[int, ...] = False

    def take(self, head: list[int], want_hidden: bool | tuple[int, ...]) -> tuple[list[Any] | None, int]:
        """The kept cache cut back to the longest prefix it shares with ``head``, and that
        length; (None, 0) when nothing is reusable. The cache is handed over: ``keep`` it again
        after the call."""
        cache, held = self.cache, self.tokens
        self.cache, self.tokens = None, []
        n = common_prefix(held, head)
        # A drafter that reads other hidden states than the kept ones starts afresh.
        if cache is None or n == 0 or (want_hidden and (self.hidden is None or self.hidden_kind != want_hidden)):
            return None, 0
        if n < len(held) and not all(c.is_trimmable() for c in cache):
            return None, 0  # recurrent state cannot be cut back to the shared prefix: start afresh
        rewind(cache, len(held) - n)
        return cache, n

    def keep(self, cache: list[Any], tokens: list[int], hidden: mx.array | None = None,
             hidden_kind: bool | tuple[int, ...] = False) -> None:
        self.cache, self.tokens, self.hidden = cache, list(tokens), hidden
        self.hidden_kind = hidden_kind if hidden is not None else False
