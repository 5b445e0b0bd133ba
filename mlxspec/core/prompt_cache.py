"""The target's KV caches kept from one call to the next (chat turns, server requests), so a
prompt that starts like an earlier conversation prefills only what is new.

Several conversations are kept at once, least recently used first out, within a count and a
byte limit (as mlx-lm's server's ``--prompt-cache-size`` / ``--prompt-cache-bytes``): two
clients taking turns each find their own conversation. mlx-lm's ``LRUPromptCache`` is not used
because an entry here also holds the target's hidden states of its tokens (an eagle head
restarts from them) and may hold a torch cache."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxspec.core.cache import common_prefix, rewind

UNLIMITED = 1 << 62


@dataclass
class Entry:
    """Tokens, the cache holding exactly them, and their hidden states (only when a drafter
    that reads them ran) of the kind ``hidden_kind`` names: the drafter's ``wants_hidden``, the
    final state (True) or those entering some blocks (their indices, an EAGLE-3 head)."""

    cache: list[Any]
    tokens: list[int]
    hidden: Any = None
    hidden_kind: bool | tuple[int, ...] = False

    def serves(self, want_hidden: bool | tuple[int, ...]) -> bool:
        """Whether a drafter wanting ``want_hidden`` can start from this entry's hidden states."""
        return not want_hidden or (self.hidden is not None and self.hidden_kind == want_hidden)

    @property
    def nbytes(self) -> int:
        """Memory the entry holds: every layer's allocated buffers (grown in steps, so more than
        its tokens need) and the hidden states."""
        return sum(layer_bytes(c) for c in self.cache) + (0 if self.hidden is None else int(self.hidden.nbytes))

    @property
    def trimmable(self) -> bool:
        return all(c.is_trimmable() for c in self.cache)


def layer_bytes(layer: Any) -> int:
    """Bytes one layer's cache holds: mlx-lm's caches and ours say so (``nbytes``); anything
    else is counted from the arrays of its ``state``."""
    n = getattr(layer, "nbytes", None)
    if n is not None:
        return int(n)
    state = layer.state
    return sum(int(a.nbytes) for a in (state if isinstance(state, (list, tuple)) else [state]) if a is not None)


@dataclass(frozen=True)
class Reuse:
    """What a call starts from: a cache holding the first ``n`` tokens of its prompt (None: start
    afresh) and their hidden states when asked for."""

    cache: list[Any] | None = None
    n: int = 0
    hidden: Any = None


@dataclass(frozen=True)
class CacheStats:
    entries: int
    nbytes: int
    hits: int  # calls that reused a kept prefix
    misses: int  # calls that started afresh


class PromptCache:
    """Up to ``max_entries`` kept caches in at most ``max_bytes``, least recently used evicted
    first. ``take`` hands a call the entry sharing the longest prefix with its prompt; ``keep``
    stores the call's cache afterwards. One thread uses it at a time (the decoder's, the chat's
    worker); ``stats`` may be read from any."""

    def __init__(self, max_entries: int = 1, max_bytes: int = UNLIMITED):
        if max_entries < 1:
            raise ValueError(f"a prompt cache keeps at least one entry, got {max_entries}")
        if max_bytes < 0:
            raise ValueError(f"a prompt cache's byte limit must be >= 0, got {max_bytes}")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: list[Entry] = []  # least recently used first
        self._bytes: list[int] = []  # each entry's nbytes, counted once when kept
        self._total = 0  # sum(self._bytes), an int another thread can read whole
        self.hits = self.misses = 0

    def stats(self) -> CacheStats:
        return CacheStats(len(self._bytes), self._total, self.hits, self.misses)

    @property
    def nbytes(self) -> int:
        return self._total

    def _drop(self, i: int) -> None:
        del self.entries[i]
        self._total -= self._bytes.pop(i)

    def take(self, head: Sequence[int], want_hidden: bool | tuple[int, ...]) -> Reuse:
        """A cache cut back to the longest prefix some entry shares with ``head``. An entry that
        ``head`` extends is handed over (the call ``keep``s it again, longer); one that holds
        more than the shared prefix (another branch of a conversation, another client with the
        same system prompt) stays, and the call gets a trimmed copy, unless this cache keeps a
        single entry, where the call's own would replace it anyway."""
        best, n = None, 0
        for e in self.entries:
            m = common_prefix(e.tokens, head)
            usable = e.serves(want_hidden) and (m == len(e.tokens) or e.trimmable)
            if usable and m > n:
                best, n = e, m
        if best is None:
            self.misses += 1
            return Reuse()
        self.hits += 1
        i = self.entries.index(best)
        if n == len(best.tokens) or self.max_entries == 1:
            self._drop(i)
            cache = best.cache
        else:
            cache = copy.deepcopy(best.cache)
            self.entries.append(self.entries.pop(i))  # a shared prefix counts as a use
            self._bytes.append(self._bytes.pop(i))
        rewind(cache, len(best.tokens) - n)
        return Reuse(cache, n, best.hidden[:n] if want_hidden else None)

    def keep(self, cache: list[Any], tokens: Sequence[int], hidden: Any = None,
             hidden_kind: bool | tuple[int, ...] = False) -> None:
        """Store ``cache`` holding ``tokens`` as the most recent entry. Entries it makes
        redundant (the same tokens, or a prefix of them, which it can serve by trimming) go;
        then the least recently used until both limits hold (the new one too, if it alone is
        over the byte limit)."""
        new = Entry(cache, list(tokens), hidden, hidden_kind if hidden is not None else False)
        for i in reversed(range(len(self.entries))):
            e = self.entries[i]
            if e.tokens == new.tokens or (new.trimmable and new.tokens[: len(e.tokens)] == e.tokens
                                          and (e.hidden is None or new.serves(e.hidden_kind))):
                self._drop(i)
        self.entries.append(new)
        self._bytes.append(new.nbytes)
        self._total += self._bytes[-1]
        while self.entries and (len(self.entries) > self.max_entries or self._total > self.max_bytes):
            self._drop(0)

    def clear(self) -> None:
        self.entries, self._bytes, self._total = [], [], 0
