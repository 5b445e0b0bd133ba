"""The batch-invariant MLX CPU pass measured as ``verify_routes.py``'s ``mlx-invariant`` route
(``benchmarks/mlx_invariant.py``, not adopted: slower than ``CpuPath``). Its note claims every
row of a pass over n tokens has the bits of the one-token pass at that position; these tests
check that claim, and that the plain CPU path fails the same check on the real model."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)
from mlxspec.core.cache import rewind
from mlxspec.core.model import Llama, LlamaConfig
from tiny import TWIN_BASE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import mlx_invariant  # noqa: E402

FAMILIES = {
    "llama": {},
    "gguf-rope": dict(rope_traditional=True),
    "untied": dict(tie_embeddings=False),
    "no-gqa": dict(num_kv_heads=4),
    "mqa": dict(num_kv_heads=1),
}
TOKENS = [11, 4, 30, 2, 47, 19, 8, 25]


def tiny(seed: int = 0, **family) -> Llama:
    mx.random.seed(seed)
    model = Llama(LlamaConfig(**{**TWIN_BASE, **family}))
    mx.eval(model.parameters())
    return model


def rows_equal_one_token_passes(model: Llama, context: list[int], tokens: list[int]) -> list[list[bool]]:
    """For n = 1..len(tokens): whether each row of one pass over tokens[:n] (after ``context``)
    equals, bitwise, the one-token pass that decodes tokens[i] at that position."""
    cache = model.make_cache()
    model(mx.array([context]), cache)
    singles = [model(mx.array([[t]]), cache)[0, 0] for t in tokens]
    rewind(cache, len(tokens))
    out = []
    for n in range(1, len(tokens) + 1):
        rows = model(mx.array([tokens[:n]]), cache)[0]
        rewind(cache, n)
        out.append([mx.array_equal(rows[i], singles[i]).item() for i in range(n)])
    return out


def needs_floors(path) -> None:
    """The route pads each product to the row count from which its rows agree; whether a BLAS
    build on a CPU has one is probed. OpenBLAS on an AMD EPYC had none up to 16 rows (on the
    Xeons measured it had: benchmarks/notes/2026-12-02-mlx-invariant.md), so there the route
    cannot be invariant and says so."""
    if not path.floors.invariant:
        pytest.skip("this CPU's OpenBLAS gives no product a row count from which its rows agree")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("context", [1, 60, 250])  # 60 + 8 and 250 + 8 cross a KEY_BLOCK of keys
def test_every_row_equals_the_one_token_pass_bitwise(family, context):
    model = tiny(**FAMILIES[family])
    path = mlx_invariant.invariant_path(model)
    needs_floors(path)
    model.run_cpu_path(path)
    assert model.cpu_path() is path
    got = rows_equal_one_token_passes(model, [(7 * i + 3) % 48 for i in range(context)], TOKENS)
    assert all(all(r) for r in got), got


def test_attention_is_attention_with_a_mask():
    """Block-wise attention over a longer buffer (slots past the keys masked) is MLX's attention."""
    k1, k2, k3, k4 = mx.random.split(mx.random.key(0), 4)
    B, hkv, group, L, S, D = 1, 2, 3, 5, 150, 16
    q = mx.random.normal((B, hkv * group, L, D), key=k1)
    keys, values = (mx.random.normal((B, hkv, 256, D), key=k) for k in (k2, k3))
    mask = mx.random.uniform(shape=(L, S), key=k4) < 0.7
    mask[:, 0] = True
    want = mx.fast.scaled_dot_product_attention(q, keys[:, :, :S], values[:, :, :S], scale=0.25, mask=mask)
    rows = (q * 0.25).reshape(B, hkv, group * L, D)
    bias = mlx_invariant.attention_bias(mask, L, S, group, mx.float32)
    got = mlx_invariant.attention(rows, keys, values, bias).reshape(B, hkv * group, L, D)
    assert mx.allclose(got, want, atol=1e-6, rtol=1e-5).item()


def test_row_floor_finds_where_rows_agree():
    """A product whose rows agree from 3 rows on (a stand-in that rounds fewer rows differently;
    an elementwise product and a sum per row, whose bits no BLAS kernel choice moves)."""
    w = mx.random.normal((8, 16), key=mx.random.key(1))

    def product(x):
        out = (x[..., None, :] * w).sum(axis=-1)
        return out + 1e-3 if x.shape[-2] < 3 else out

    assert mlx_invariant.row_floor(product, 16, mx.float32) == 3
    assert mlx_invariant.row_floor(lambda x: (x[..., None, :] * w).sum(axis=-1) + 1e-3 * x.shape[-2], 16,
                                   mx.float32) is None


@pytest.mark.model
def test_real_model_rows_equal_and_the_plain_path_does_not(lm):
    text = [(97 * i) % lm.config.vocab_size for i in range(260)]
    context, tokens = text[:252], text[252:]  # 252 + 8 crosses a KEY_BLOCK and the cache's 256 step
    model = lm.model
    plain = rows_equal_one_token_passes(model, context, tokens)
    path = mlx_invariant.invariant_path(model)
    needs_floors(path)
    model.run_cpu_path(path)
    try:
        got = rows_equal_one_token_passes(model, context, tokens)
    finally:
        model.run_cpu_path(None)
    assert all(all(r) for r in got), got
    assert not all(all(r) for r in plain)
