"""The byte product on AVX-512 VNNI (``mlxspec/torchpath/vnni.py``, ``qmm.cpp``): the arithmetic
it promises (activations as two bytes per value per group of 32, integer dot products, the
file's scales and biases), rows invariant whatever the pass width and thread count, the build
kept in the store and refused cleanly, and the file's 8-bit head on it."""

from __future__ import annotations

import subprocess

import mlx.core as mx
import numpy as np
import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from mlxspec.torchpath import int4, invariant, vnni  # noqa: E402
from tiny import quantized_twin, torch_rows_equal_one_token_passes  # noqa: E402

pytestmark = pytest.mark.skipif(not vnni.supported(), reason="the kernel needs AVX-512 VNNI on x86-64 Linux")


def stored(n: int, k: int, bits: int, group: int = 32, seed: int = 0):
    """Random stored weights as a file holds them: q, float16-exact scales and biases."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (n, k), generator=g)
    scales = (torch.rand(n, k // group, generator=g) * 0.02).half().float()
    biases = (torch.randn(n, k // group, generator=g) * 0.1).half().float()
    return q, scales, biases


def reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor) -> np.ndarray:
    """The promised arithmetic: x rounded to bfloat16; per group of 32 a scale mapping its largest
    magnitude to 127, each value as a high byte (rounded at that scale, ties to even) and a low
    one (the rest at 1/256 of it); exact integer dot products, 256 hi + lo; then in float64 the
    file's scale times the low byte's step, and its bias times the group's sum."""
    x = x.bfloat16().float().numpy().reshape(x.shape[0], -1, 32)
    n, k = q.shape
    per = k // scales.shape[1] // 32
    s = scales.repeat_interleave(per, 1).double().numpy()
    b = biases.repeat_interleave(per, 1).double().numpy()
    amax = np.abs(x).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    scaled = (x * inv).astype(np.float32)
    hi = np.rint(scaled)
    lo = np.clip(np.rint((scaled - hi) * np.float32(256)), -128, 127)
    a = (256 * hi + lo).astype(np.int64)
    step = (amax[..., 0] / np.float32(127) / np.float32(256)).astype(np.float32).astype(np.float64)
    dots = np.einsum("mgi,ngi->mng", a, q.numpy().reshape(n, -1, 32).astype(np.int64)).astype(np.float64)
    sums = x.astype(np.float64).sum(-1)
    return (dots * s[None] * step[:, None, :]).sum(-1) + (b[None] * sums[:, None, :]).sum(-1)


@pytest.mark.parametrize("bits,group,n", [(4, 32, 96), (4, 64, 40), (8, 32, 48), (8, 128, 21)])
def test_the_product_is_the_promised_arithmetic(bits, group, n):
    q, scales, biases = stored(n, 256, bits, group, seed=bits + group)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1))
    x[2, :32] = 0.0  # a group of zeros: scale 0, nothing divided by it
    w, sz = vnni.repack(q, scales, biases, bits)
    got = vnni.product(x, w, sz, bits, n)
    assert got.shape == (5, n) and got.dtype == torch.float32
    want = reference(x, q, scales, biases)
    assert np.abs(got.numpy() - want).max() <= 1e-5 * np.abs(want).max()
    dense = (q.float().view(n, -1, group) * scales[..., None] + biases[..., None]).reshape(n, -1)
    exact = (x.double() @ dense.double().T).numpy()
    assert np.abs(got.numpy() - exact).max() < 3e-3 * np.abs(exact).max()  # bfloat16's digits, not one byte's


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rows_have_the_one_row_bits_at_every_width(threads):
    """Row i of an n-row product (n = 1..9: tails of the kernel's 4-row blocks) has the bits of
    the one-row product, for SmolLM2-135M's fused shapes and its 8-bit head's width."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n, k, bits in ((960, 576, 4), (576, 1536, 4), (3072, 576, 4), (4096, 576, 8)):
            w, sz = vnni.repack(*stored(n, k, bits, seed=threads), bits)
            x = torch.randn(9, k, generator=torch.Generator().manual_seed(threads))
            singles = [vnni.product(x[i:i + 1], w, sz, bits) for i in range(9)]
            for rows in range(1, 10):
                out = vnni.product(x[:rows], w, sz, bits)
                assert all(torch.equal(out[i], singles[i][0]) for i in range(rows)), (n, k, rows)
    finally:
        torch.set_num_threads(before)


def attention_case(rows: int, width: int, held: int, heads: int = 3, dim: int = 64, seed: int = 0):
    """Queries, a cache's buffers (wider than attended) and a bias hiding the keys past ``held``,
    with row 1 also hiding the last 70 held: a block of 64 keys all hidden from it."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, rows, dim, generator=g) * 2
    keys, values = (torch.randn(1, heads, width + 64, dim, generator=g) for _ in range(2))
    bias = torch.zeros(heads, max(rows, 4), width)
    bias[..., held:] = float("-inf")
    bias[:, 1, held - 70:] = float("-inf")
    return q, keys, values, bias


@pytest.mark.parametrize("rows,width,held,dim", [(3, 128, 100, 64), (12, 256, 200, 64), (27, 448, 400, 32)])
def test_attention_is_the_softmax_over_the_keys_held(rows, width, held, dim):
    q, keys, values, bias = attention_case(rows, width, held, dim=dim)
    got = torch.ops.mlxspec_vnni.attend(q, keys, values, bias, 0.125)
    k, v = keys[0, :, :width].double(), values[0, :, :width].double()
    scores = torch.einsum("hrd,hkd->hrk", q.double(), k) * 0.125 + bias[:, :rows].double()
    want = torch.softmax(scores, -1) @ v
    assert got.shape == q.shape and float((got.double() - want).abs().max()) < 1e-5


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_an_attention_row_has_its_own_bits(threads):
    """A query's output is the same whatever the rows beside it and the threads splitting the keys."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, keys, values, bias = attention_case(12, 448, 400, seed=threads)
        together = torch.ops.mlxspec_vnni.attend(q, keys, values, bias, 0.125)
        for r in range(12):
            alone = torch.ops.mlxspec_vnni.attend(q[:, r:r + 1].contiguous(), keys, values,
                                                  bias[:, r:r + 1].contiguous(), 0.125)
            assert torch.equal(alone[:, 0], together[:, r]), r
    finally:
        torch.set_num_threads(before)


def test_the_kernels_are_built_to_run_on_every_thread():
    """Built without OpenMP, at::parallel_for compiles to a plain loop: the products ran on one of
    two threads, unnoticed, until a profile showed a product taking as long at 1 and 2 threads."""
    from mlxspec.targets import loading

    path = vnni.library(loading.compiled_folder() / "kernels")
    assert vnni.active() and path.exists()
    assert "libgomp" in subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout


def test_the_build_is_kept_and_reused(tmp_path):
    (tmp_path / "qmm-0123456789abcdef.so").write_bytes(b"an earlier build")
    built = vnni.build(tmp_path)
    assert built == vnni.library(tmp_path) and built.stat().st_size > 0
    assert [p.name for p in tmp_path.glob("qmm-*.so")] == [built.name]  # the earlier build removed
    logs = []
    assert vnni.ensure(tmp_path, logs.append) and logs == []  # loaded already: nothing built or said


def test_a_failed_build_says_so_and_keeps_torchs_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(subprocess.CalledProcessError):
        vnni.build(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
    monkeypatch.setattr(vnni, "active", lambda: False)
    logs = []
    assert not vnni.ensure(tmp_path / "fresh", logs.append)
    assert len(logs) == 2 and logs[1].startswith("note: could not build")


def test_a_damaged_build_is_removed_and_torchs_kernels_run(tmp_path, monkeypatch):
    monkeypatch.setattr(vnni, "active", lambda: False)
    vnni.library(tmp_path).write_bytes(b"not a shared library")
    logs = []
    assert not vnni.ensure(tmp_path, logs.append)
    assert len(logs) == 1 and "did not load" in logs[0] and not vnni.library(tmp_path).exists()


def test_a_cpu_without_vnni_keeps_torchs_kernels(tmp_path, monkeypatch):
    monkeypatch.setattr(vnni, "active", lambda: False)
    monkeypatch.setattr(vnni, "supported", lambda: False)
    assert not vnni.ensure(tmp_path) and list(tmp_path.iterdir()) == []
    _, model = quantized_twin(2)
    assert model.quantized_head is None and invariant.make_batch_invariant(model)
    model(torch.tensor([[1, 2]]), None)
    assert model.model.layers[0].self_attn.fused_qkv.scales_zeros.dtype == torch.bfloat16  # torch's kernel


@pytest.mark.parametrize("bits", [8, 4])
def test_a_tied_head_multiplies_the_files_quantized_embedding(bits):
    mlx_model, model = quantized_twin(4, embedding_bits=bits)
    assert isinstance(model.quantized_head, int4.QuantizedHead)
    invariant.make_batch_invariant(model)
    assert model.packed_head is model.quantized_head
    assert model.model.layers[0].self_attn.fused_qkv is not None
    e = mlx_model.model.embed_tokens
    table = torch.from_numpy(np.array(mx.dequantize(e.weight, e.scales, e.biases, group_size=32, bits=bits)))
    h = torch.randn(3, table.shape[1], generator=torch.Generator().manual_seed(5))
    want = h.double() @ table.double().T
    got = model.head(h)
    assert float((got.double() - want).abs().max() / want.abs().max()) < 2e-2
    ctx = [(5 * i + 2) % 48 for i in range(40)]
    assert all(all(r) for r in torch_rows_equal_one_token_passes(model, ctx, [3, 9, 1, 30]))


def test_an_untied_head_keeps_its_own_layer():
    _, untied = quantized_twin(1, tie_embeddings=False)
    assert untied.quantized_head is None and isinstance(untied.lm_head, int4.Int4Linear)


def test_the_kernel_has_its_own_verify_cost_curve(monkeypatch):
    """--k auto's curve measured on torch's kernel would mislead it on this one (and back)."""
    from types import SimpleNamespace

    from mlxspec.targets import costcurve

    lm = SimpleNamespace(backend="torch:cpu", dtype="quantized", model=SimpleNamespace(batch_invariant=True))
    on = costcurve.device_of(lm)
    monkeypatch.setattr(vnni, "active", lambda: False)
    off = costcurve.device_of(lm)
    assert f"-vnni{vnni.build_id()}" in on and "vnni" not in off
    assert on.replace(f"-vnni{vnni.build_id()}", "") == off


@pytest.mark.model
def test_only_a_quantized_torch_load_loads_the_kernel(monkeypatch):
    """A float32 target on torch multiplies nothing on the kernel: no build for it."""
    from mlxspec.targets import loading

    calls = []
    monkeypatch.setattr(loading, "with_kernels", lambda: calls.append(1) or True)
    loading.load("default", "float32", backend="torch:cpu")
    assert calls == []
    loading.load("default", "quantized", backend="torch:cpu")
    assert calls == [1]


def test_a_drafters_float_weights_rounded_to_bits_on_the_kernel():
    """``int4.QuantizedWeight``: the product of the rounded weights (to the kernel's arithmetic),
    near the float one, rows invariant, fused columns each layer's own, rounded again after an
    in-place change; a width of partial groups is not taken."""
    g = torch.Generator().manual_seed(3)
    w1, w2 = torch.randn(48, 96, generator=g) * 0.1, torch.randn(20, 96, generator=g) * 0.1
    bias = torch.randn(48, generator=g)
    x = torch.randn(5, 96, generator=g)
    for bits in (4, 8):
        one = int4.QuantizedWeight([w1], [bias], bits)
        got = one(x)
        words, s, b = mx.quantize(mx.array(w1.numpy()).astype(mx.float16), group_size=32, bits=bits)
        q = int4.unpack(torch.from_numpy(np.array(words)).view(torch.int32), bits)
        s, b = (torch.from_numpy(np.array(t.astype(mx.float32))) for t in (s, b))
        np.testing.assert_allclose(got.numpy(), reference(x, q, s, b) + bias.numpy(), rtol=1e-5, atol=1e-4)
        error = float((got - (x @ w1.T + bias)).abs().max() / (x @ w1.T).abs().max())
        assert error < (0.1 if bits == 4 else 0.01), (bits, error)
        assert all(torch.equal(got[i], one(x[i : i + 1])[0]) for i in range(5))
        fused = int4.QuantizedWeight([w1, w2], [bias, None], bits)(x)
        assert fused.shape == (5, 68) and torch.equal(fused[:, :48], got)
        assert torch.equal(fused[:, 48:], int4.QuantizedWeight([w2], [None], bits)(x))
    one = int4.QuantizedWeight([w1], [None], 4)
    before = one(x)
    w1.mul_(2.0)
    assert torch.allclose(one(x), 2 * before, rtol=1e-2, atol=1e-3) and not torch.equal(one(x), before)
    assert int4.QuantizedWeight.takes([w1]) and not int4.QuantizedWeight.takes([torch.zeros(4, 48)])


def test_a_heads_linears_are_rounded_where_they_take_it():
    """``pack_linears`` with bits: whole-group layers (and the fused q, k, v) on the kernel, the
    rest packed for oneDNN."""
    from torch import nn

    module = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 48), nn.Linear(48, 16))
    assert invariant.pack_linears(module, torch.float32, bits=4)
    kernels = [type(m.kernel) for m in module]
    assert kernels == [int4.QuantizedWeight, int4.QuantizedWeight, invariant.PackedWeight]
