"""A trimmable KV cache for the torch llama module, with the interface of mlx-lm's ``KVCache``
(``offset``, ``update_and_fetch``, ``trim``, ``state``) so ``core.cache``'s ``rewind``,
``check_trimmable`` and ``prompt_cache`` work on it unchanged."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KVCache:
    """Keys and values (B, H, positions, D) in buffers grown ``step`` positions at a time, so a
    decoding step writes in place instead of concatenating the whole history."""

    step = 256

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.offset = 0

    def update_and_fetch(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[-2]
        if self.keys is None or self.offset + n > self.keys.shape[-2]:
            grow = ((self.offset + n + self.step - 1) // self.step) * self.step
            keys = k.new_zeros((*k.shape[:-2], grow, k.shape[-1]))
            values = v.new_zeros((*v.shape[:-2], grow, v.shape[-1]))
            if self.keys is not None:
                keys[..., : self.offset, :] = self.keys[..., : self.offset, :]
                values[..., : self.offset, :] = self.values[..., : self.offset, :]
            self.keys, self.values = keys, values
        self.keys[..., self.offset : self.offset + n, :] = k
        self.values[..., self.offset : self.offset + n, :] = v
        self.offset += n
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @property
    def state(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.keys is None:
            return None, None
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @property
    def nbytes(self) -> int:
        """The buffers' size, allocated positions included (what a prompt cache's byte limit counts)."""
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n


def keep_rows(cache: Sequence[KVCache], start: int, rows: Sequence[int]) -> None:
    """``core.cache.keep_rows`` for these buffers: keep the first ``start`` positions, then
    positions ``start + r`` for r in ``rows`` (increasing), in that order; forget the rest."""
    n = len(rows)
    if list(rows) != list(range(n)):
        idx = torch.tensor([start + r for r in rows], dtype=torch.long, device=cache[0].keys.device)
        for c in cache:
            c.keys[..., start : start + n, :] = c.keys.index_select(-2, idx)
            c.values[..., start : start + n, :] = c.values.index_select(-2, idx)
    for c in cache:
        c.trim(c.offset - start - n)
