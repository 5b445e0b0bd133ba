"""A batch-invariant MLX CPU target pass, the ``mlx-invariant`` route of ``verify_routes.py``:
row i of a pass over n tokens gets the bits the one-token pass gives at that position, so
greedy speculation would equal target-only decoding by construction rather than by the luck of
near-ties. It is exact (36 / 36 rows) but slower than ``core.model.CpuPath`` at every pass
length, so it is measured here and not adopted (benchmarks/notes/2026-12-02-mlx-invariant.md).

Two things break that in a plain pass (``benchmarks/verify_routes.py`` measures them):

* A BLAS product ``x @ W.T`` sums a row in an order that depends on how many rows the call
  holds: OpenBLAS's one-row product (a GEMV) and its small-matrix paths differ from its many-row
  kernel, and where the classes begin depends on the shape and on the BLAS build (here the
  576 x 576 projections agree from 3 rows, 576 -> 192 from 7, the head at every count). So the
  classes are not assumed: ``row_floor`` finds, for each product the pass makes, the fewest
  rows from which every row count up to ``PROBE_ROWS`` agrees, and the pass pads smaller
  products with zero rows to it (their outputs are dropped).
* Attention over the keys sums in blocks whose boundaries move with the number of keys and
  queries. ``attention`` reads the KV cache's whole buffer, ``KEY_BLOCK`` keys at a time (one
  batched product per block, so every product has one shape whatever the context), with the
  queries of one key head as the rows of one product, padded to their floor; masked and unused
  keys get -inf scores, whose exponentials are exact zeros, and the blocks' parts are added in
  order. A query then meets the same sums whether it came alone or with the n - 1 after it.

Elementwise ops and the row-wise RMSNorm and reductions of a fixed length are already
row-invariant. Whether a product is, is a property of the BLAS build, not a documented
promise, so ``invariance`` in ``verify_routes.py`` checks whole passes bitwise, as does
``tests/test_mlx_invariant.py`` on tiny models.
"""

# ruff: noqa: I001
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from mlxspec.core.model import CpuPath, Llama, rotate

# Key positions per attention block (a divisor of the KV cache's growth step, 256, so a buffer is
# whole blocks). Smaller blocks waste fewer exponentials past the last key (MLX's CPU exp is
# scalar) for more, smaller products: 64 was the cheapest of 64 / 128 / 256 here.
KEY_BLOCK = 64
# Row counts checked by ``row_floor``: every verify pass of the engine's chains (K <= 15) and
# auto trees (16 nodes) is within it.
PROBE_ROWS = 16


def row_floor(product: Callable[[mx.array], mx.array], width: int, dtype: mx.Dtype,
              rows: int = PROBE_ROWS) -> int | None:
    """The fewest rows m such that ``product`` (a function of an (..., M, width) input, rows
    independent in exact arithmetic) gives every row of an M-row input, for every M in
    m..``rows``, the bits that row has in the ``rows``-row product, at the first rows and at
    the last. None if even ``rows - 1`` rows do not agree. Longer products (prefill chunks)
    are not compared: no pass they make has to match another."""
    x = mx.random.normal((rows, width), key=mx.random.key(0)).astype(dtype)
    ref = product(x)
    mx.eval(ref)
    floor = rows
    for m in range(rows - 1, 0, -1):
        starts = (0, rows - m)  # a row's place among the rows has not mattered; its count has
        outs = [product(x[s: s + m]) for s in starts]
        if not all(mx.array_equal(o, ref[..., s: s + m, :]).item() for o, s in zip(outs, starts)):
            break
        floor = m
    return None if floor == rows else floor


def pad_rows(x: mx.array, floor: int) -> mx.array:
    """``x`` (..., M, K) with zero rows appended up to ``floor`` rows."""
    m = x.shape[-2]
    if m >= floor:
        return x
    return mx.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, floor - m), (0, 0)])


def linear(x: mx.array, weight: mx.array, floor: int) -> mx.array:
    """``x @ weight.T`` over the rows of x (B, L, in) run as at least ``floor`` rows."""
    B, L, _ = x.shape
    rows = x.reshape(B * L, -1)
    return (pad_rows(rows, floor) @ weight.T)[: B * L].reshape(B, L, -1)


def attention_bias(mask: mx.array | None, length: int, keys: int, group: int, dtype: mx.Dtype) -> mx.array:
    """The scores' additive mask for ``attention``: 0 where a query sees a key, -inf at masked
    keys and past the pass's ``keys`` up to a whole ``KEY_BLOCK``. ``mask``: None (every key),
    or boolean (L, S) / (B, 1, L, S), True where attended, or additive of those shapes;
    ``group`` query heads per key head. Shaped (B or 1, 1, blocks, group * L, KEY_BLOCK), to
    add to the block-wise scores (its shape tells ``attention`` the blocks and rows)."""
    if mask is None:
        bias = mx.zeros((1, length, keys), dtype)
    elif mask.dtype == mx.bool_:
        bias = mx.where(mask, mx.array(0.0, dtype), mx.array(-mx.inf, dtype)).reshape(-1, length, keys)
    else:
        bias = mask.astype(dtype).reshape(-1, length, keys)
    batch = bias.shape[0]
    bias = mx.pad(bias, [(0, 0), (0, 0), (0, -keys % KEY_BLOCK)], constant_values=-mx.inf)
    rows = group * length
    bias = mx.broadcast_to(bias[:, None], (batch, group, length, bias.shape[-1])).reshape(batch, 1, rows, -1, KEY_BLOCK)
    return mx.contiguous(bias.transpose(0, 1, 3, 2, 4))


def attention(q: mx.array, keys: mx.array, values: mx.array, bias: mx.array, mix_floor: int = 1) -> mx.array:
    """softmax(q k^T + bias) v, block by block. q (B, Hkv, R, D), scaled: one key head's query
    heads x tokens as rows, padded to the scores' row floor; keys, values (B, Hkv, W, D), a
    cache's buffer (its first keys, then slots ``bias`` masks), W a multiple of ``KEY_BLOCK``
    at least the blocks ``bias`` covers. Returns (B, Hkv, rows, D) for the rows ``bias`` has.

    Scores are one batched product per block of keys (one shape for every query, whatever the
    context); the max is exact in any order; exponentials are summed over one block's fixed
    length; the blocks' parts are then added along the block axis in order, and masked keys add
    exact zeros. The products of probabilities and values run as at least ``mix_floor`` rows."""
    B, hkv, _, D = keys.shape
    blocks, rows = bias.shape[2], bias.shape[3]
    kb = keys[:, :, : blocks * KEY_BLOCK].reshape(B, hkv, blocks, KEY_BLOCK, D)
    vb = values[:, :, : blocks * KEY_BLOCK].reshape(B, hkv, blocks, KEY_BLOCK, D)
    scores = (q[:, :, None] @ kb.swapaxes(-1, -2))[..., :rows, :] + bias  # (B, Hkv, blocks, rows, KEY_BLOCK)
    e = mx.exp(scores - scores.max(axis=-1, keepdims=True).max(axis=2, keepdims=True))
    total = e.sum(axis=-1).sum(axis=2)
    mixed = (pad_rows(e, mix_floor) @ vb)[..., :rows, :]
    return mixed.sum(axis=2) / total[..., None]


@dataclass(frozen=True)
class RowFloors:
    """The fewest rows each product of a pass runs as (``row_floor``), and whether every
    product has one: if one does not, passes pad to the others' floors and are not invariant."""

    q: int
    k: int
    v: int
    o: int
    gate: int
    up: int
    down: int
    head: int
    scores: int  # attention's products, whose rows are one key head's query heads x tokens
    mixes: int
    invariant: bool


def probe_floors(q: mx.array, k: mx.array, v: mx.array, o: mx.array, gate: mx.array, up: mx.array,
                 down: mx.array, head: mx.array, head_dim: int, group: int) -> RowFloors:
    """``row_floor`` of every product a pass makes, given one block's projection weights and
    the head's (each (out, in)), the head size and query heads per key head; products of one
    shape are probed once."""
    found: dict[tuple, int | None] = {}

    def linear_floor(w: mx.array) -> int | None:
        key = ("linear", tuple(w.shape), w.dtype)
        if key not in found:
            found[key] = row_floor(lambda x: x @ w.T, w.shape[1], w.dtype)
        return found[key]

    blocks = mx.random.normal((2, KEY_BLOCK, head_dim), key=mx.random.key(1)).astype(q.dtype)
    rows = group * PROBE_ROWS  # attention's products hold every query head of a key head
    scores = row_floor(lambda x: x[None] @ blocks.swapaxes(-1, -2), head_dim, q.dtype, rows)
    mixes = row_floor(lambda x: x[None] @ blocks, KEY_BLOCK, q.dtype, rows)
    every = [linear_floor(w) for w in (q, k, v, o, gate, up, down, head)] + [scores, mixes]
    return RowFloors(*(f or 1 for f in every), invariant=all(f is not None for f in every))


def whole_blocks(keys: mx.array, values: mx.array, cache: KVCache) -> tuple[mx.array, mx.array]:
    """A layer's keys and values as ``attention`` reads them: the cache's whole buffer (slots
    past its keys are masked), padded to whole ``KEY_BLOCK``s where it is not already (mlx-lm's
    buffer grows 256 positions at a time, and is whole blocks unless a pass crossed its end
    part-way)."""
    if isinstance(getattr(cache, "keys", None), mx.array):
        keys, values = cache.keys, cache.values
    pad = -keys.shape[2] % KEY_BLOCK
    if pad:
        keys, values = (mx.pad(x, [(0, 0), (0, 0), (0, pad), (0, 0)]) for x in (keys, values))
    return keys, values


class InvariantCpuPath(CpuPath):
    """``CpuPath`` with every product run as at least its ``floors`` rows and ``attention``
    over the cache's buffer. The head's product is the model's own: its rows agree at every
    count here (``floors.head`` 1), which ``invariance`` confirms."""

    def __init__(self, cfg, floors: RowFloors):
        super().__init__(cfg)
        self.floors = floors
        self.group = cfg.num_heads // cfg.num_kv_heads  # query heads per key head
        self.attention = mx.compile(partial(attention, mix_floor=floors.mixes))

    def before_attention(self, x, norm_w, q_w, k_w, v_w, cos, sin):
        """q as ``attention`` takes it (B, Hkv, rows, D), scaled; k and v (B, Hkv, L, D)."""
        c, f = self.cfg, self.floors
        B, L, _ = x.shape
        h = mx.fast.rms_norm(x, norm_w, c.rms_norm_eps)
        q, k, v = (linear(h, w, floor).reshape(B, L, -1, c.head_dim).transpose(0, 2, 1, 3)
                   for w, floor in ((q_w, f.q), (k_w, f.k), (v_w, f.v)))
        q = rotate(q, cos, sin, c.rope_traditional) * c.head_dim**-0.5
        q = pad_rows(q.reshape(B, c.num_kv_heads, self.group * L, c.head_dim), f.scores)
        return q, rotate(k, cos, sin, c.rope_traditional), v

    def after_attention(self, x, attn, o_w, norm_w, gate_w, up_w, down_w):
        f = self.floors
        B, L, _ = x.shape
        attn = attn.reshape(B, self.cfg.num_heads, L, -1).transpose(0, 2, 1, 3).reshape(B, L, -1)
        h = x + linear(attn, o_w, f.o)
        n = mx.fast.rms_norm(h, norm_w, self.cfg.rms_norm_eps)
        return h + linear(nn.silu(linear(n, gate_w, f.gate)) * linear(n, up_w, f.up), down_w, f.down)

    def pass_mask(self, mask, length: int, offset: int, dtype: mx.Dtype) -> mx.array:
        return attention_bias(super().pass_mask(mask, length, offset, dtype), length, offset + length,
                              self.group, dtype)

    def attend(self, q: mx.array, cache: KVCache, keys: mx.array, values: mx.array, mask) -> mx.array:
        return self.attention(q, *whole_blocks(keys, values, cache), mask)


def invariant_path(model: Llama) -> InvariantCpuPath:
    """An ``InvariantCpuPath`` for ``model``, its floors probed on its own weights."""
    a, m = model.layers[0].self_attn, model.layers[0].mlp
    head = model.model.embed_tokens.weight if model.cfg.tie_embeddings else model.lm_head.weight
    floors = probe_floors(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, m.gate_proj.weight,
                          m.up_proj.weight, m.down_proj.weight, head, model.cfg.head_dim,
                          model.cfg.num_heads // model.cfg.num_kv_heads)
    return InvariantCpuPath(model.cfg, floors)


def main() -> None:
    """Print the row floors this machine's BLAS gives the default model's products."""
    import argparse
    import time
    from dataclasses import asdict

    from mlxspec.targets import loading

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.parse_args()
    lm = loading.load("default", "float32")
    t0 = time.perf_counter()
    path = invariant_path(lm.model)
    print(f"probed in {time.perf_counter() - t0:.2f} s: {asdict(path.floors)}")


if __name__ == "__main__":
    main()
