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
        self.reserve(self.offset + n, (*k.shape[:-2], k.shape[-1]), k.dtype, k.device)
        self.keys[..., self.offset : self.offset + n, :] = k
        self.values[..., self.offset : self.offset + n, :] = v
        self.offset += n
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def reserve(self, positions: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        """Room for ``positions`` (``step``-aligned), the cached ones kept; ``shape``: (B, H, D).
        The compiled pass writes its keys into the buffers in place."""
        if self.keys is not None and positions <= self.keys.shape[-2]:
            return
        grow = ((positions + self.step - 1) // self.step) * self.step
        keys = torch.zeros((*shape[:-1], grow, shape[-1]), dtype=dtype, device=device)
        values = torch.zeros_like(keys)
        if self.keys is not None:
            keys[..., : self.offset, :] = self.keys[..., : self.offset, :]
            values[..., : self.offset, :] = self.values[..., : self.offset, :]
        self.keys, self.values = keys, values

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


class PackedCaches:
    """One layer's caches for a pass that packs several sequences' tokens side by side
    (``torchpath.packed``). The projections run over all the rows at once; attention runs as one
    batch, a sequence per batch entry, with its queries, keys and values padded to the longest
    and ``mask`` (n, 1, L, S) keeping each query to its own cache's keys. The padding adds exact
    zeros, so each query gets the bits of its own pass (``invariant.chunked_attention`` sums in
    the same blocks either way). ``keys`` and ``values`` (n, Hkv, S, D): where the layers of the
    pass gather each sequence's keys and values; zeroed once for the pass, a masked position
    then holds zeros or an earlier layer's keys, finite either way."""

    def __init__(self, lengths: Sequence[int], caches: Sequence[KVCache], mask: torch.Tensor,
                 keys: torch.Tensor, values: torch.Tensor):
        self.lengths, self.caches, self.mask = list(lengths), list(caches), mask
        self.keys, self.values = keys, values

    def attend(self, attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """``attend(q, k, v, mask, scale)`` over the sequences' rows (dimension 2), as one batch."""
        n, _, L, _ = self.mask.shape
        keys, values = self.keys, self.values
        for i, (ki, vi, cache) in enumerate(zip(k.split(self.lengths, dim=2), v.split(self.lengths, dim=2), self.caches)):
            ki, vi = cache.update_and_fetch(ki, vi)
            keys[i, :, : ki.shape[2]], values[i, :, : vi.shape[2]] = ki[0], vi[0]
        if all(n_i == L for n_i in self.lengths):  # as many rows each (decoding steps): views, no copies
            out = attend(q[0].unflatten(1, (n, L)).transpose(0, 1), keys, values, self.mask, scale)
            return out.transpose(0, 1).reshape(1, q.shape[1], n * L, q.shape[3])
        qs = q.new_zeros((n, q.shape[1], L, q.shape[3]))
        for i, qi in enumerate(q.split(self.lengths, dim=2)):
            qs[i, :, : qi.shape[2]] = qi[0]
        out = attend(qs, keys, values, self.mask, scale)
        return torch.cat([out[i : i + 1, :, :n_i] for i, n_i in enumerate(self.lengths)], dim=2)

    @staticmethod
    def gathered(n: int, heads: int, positions: int, dims: int, like: torch.Tensor) -> torch.Tensor:
        """A zeroed (n, heads, positions, dims) buffer for ``keys`` or ``values``, with room for
        ``KVCache.step``-aligned positions as a cache's own buffer has: attention's key blocks
        then read the padding in place instead of copying the keys into a wider tensor."""
        room = positions + (-positions % KVCache.step)
        return like.new_zeros((n, heads, room, dims))[:, :, :positions]


def packed_mask(lengths: Sequence[int], offsets: Sequence[int], masks: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """``PackedCaches``'s mask (n, 1, L, S), True where attended: sequence i's own mask (None: a
    one-token pass, every key) over its L_i queries and offset_i + L_i keys; a padded query row
    sees the first key only, so that its output (dropped) stays finite."""
    L, S = max(lengths), max(o + n for o, n in zip(offsets, lengths))
    out = torch.zeros((len(lengths), 1, L, S), dtype=torch.bool)
    for i, (n, o, m) in enumerate(zip(lengths, offsets, masks)):
        out[i, 0, :n, : o + n] = True if m is None else m.reshape(n, o + n).to("cpu")
        out[i, 0, n:, 0] = True
    return out
