"""KV-cache rollback, in one place: speculation appends drafts to every cache, then cuts the
rejected ones off again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import RotatingKVCache

from mlxspec.errors import MlxspecError


def check_trimmable(cache: Sequence[Any], owner: str) -> list[Any]:
    """``cache`` if every layer can be rolled back, else a clear error naming ``owner``.

    A rotating cache reports itself trimmable until it wraps, then silently is not, so it is
    refused up front rather than corrupting a long generation."""
    if not all(c.is_trimmable() and not isinstance(c, RotatingKVCache) for c in cache):
        kind = type(cache[0]).__name__ if cache else "none"
        raise MlxspecError(
            f"{owner} uses a cache that cannot be rolled back ({kind}: rotating or recurrent); "
            "speculative decoding needs a trimmable KV cache"
        )
    return list(cache)


def rewind(cache: Sequence[Any], n: int) -> None:
    """Forget the last ``n`` tokens of every layer's cache (lazy: no evaluation)."""
    if n > 0:
        for c in cache:
            c.trim(n)
