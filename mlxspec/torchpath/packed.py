"""Several sequences' passes as one: their tokens side by side in one pass of the torch llama
module, so the weights are read once for all of them (decoding is bound by reading them).

Every row is computed as in its own pass: the projections, norms and MLP are row-invariant
(``invariant.make_batch_invariant``: a row has the same bits among 1 to 64 rows), RoPE is per
position, and attention batches the sequences with each query kept to its own cache's keys by
the mask, padding that adds exact zeros (``cache.PackedCaches``). So each sequence's logits have
the bits of its own pass, and greedy replies decoded together equal those decoded alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mlxspec.torchpath.cache import KVCache, PackedCaches, packed_mask
from mlxspec.torchpath.model import Llama, pass_inputs

MAX_ROWS = 64  # rows of one packed pass at most: the head's kernel is row-invariant up to 64


@dataclass
class Pass:
    """One sequence's pass, with the arguments of ``Llama.forward``."""

    tokens: torch.Tensor  # (1, L)
    cache: list[KVCache]
    mask: Any = None
    positions: Any = None
    return_hidden: bool | tuple[int, ...] = False
    logit_rows: int | None = None

    @property
    def rows(self) -> int:
        return self.tokens.shape[-1]


def packed_forward(model: Llama, passes: list[Pass]) -> list[Any]:
    """Each pass's ``model(...)`` result, from one pass over all their tokens."""
    if sum(p.rows for p in passes) > MAX_ROWS:
        raise ValueError(f"a packed pass holds {MAX_ROWS} rows at most")
    if model.threads is not None:
        model.threads.tick()
    lengths, offsets = [p.rows for p in passes], [p.cache[0].offset for p in passes]
    h = model.model.embed_tokens(torch.cat([p.tokens.reshape(1, -1) for p in passes], dim=1).to(model.device))
    inputs = [pass_inputs(n, o, p.mask, p.positions, h.device) for n, o, p in zip(lengths, offsets, passes)]
    mask = packed_mask(lengths, offsets, [m for m, _ in inputs]).to(h.device)
    cos, sin = model.rope.tables(torch.cat([positions for _, positions in inputs]), h.dtype)
    taps = sorted({t for p in passes if isinstance(p.return_hidden, tuple) for t in p.return_hidden})
    tapped: dict[int, torch.Tensor] = {}
    shape = (len(passes), model.cfg.num_kv_heads, mask.shape[-1], model.cfg.head_dim)
    keys, values = PackedCaches.gathered(*shape, like=h), PackedCaches.gathered(*shape, like=h)
    for i, layer in enumerate(model.layers):
        if i in taps:
            tapped[i] = h
        caches = PackedCaches(lengths, [p.cache[i] for p in passes], mask, keys, values)
        h = layer(h, None, caches, model.rope, cos, sin)
    tapped[len(model.layers)] = h
    h = model.model.norm(h)
    starts = [sum(lengths[:i]) for i in range(len(passes))]
    logits = _head_rows(model, h, passes, starts)
    out: list[Any] = []
    for p, start, rows in zip(passes, starts, logits):
        span = slice(start, start + p.rows)
        if isinstance(p.return_hidden, tuple):
            out.append((rows, torch.cat([tapped[t][:, span] for t in sorted(set(p.return_hidden))], dim=-1)))
        else:
            out.append((rows, h[:, span]) if p.return_hidden else rows)
    return out


def _head_rows(model: Llama, h: torch.Tensor, passes: list[Pass], starts: list[int]) -> list[torch.Tensor]:
    """Each pass's logits (1, n, V): its last ``logit_rows`` rows (all by default), through the
    head in one product."""
    wanted = [p.rows if p.logit_rows is None else p.logit_rows for p in passes]
    index = [i for p, s, n in zip(passes, starts, wanted) for i in range(s + p.rows - n, s + p.rows)]
    if not index:
        return [h.new_empty((1, 0, 0))] * len(passes)
    logits = model.head(h[:, index])
    return list(logits.split(wanted, dim=1))
