"""The file's 4-bit weights in torch's int4 kernel (``mlxspec/torchpath/int4.py``): the stored
nibbles read back exactly, the product is x @ W.T to bfloat16 rounding, fused products give
each column its own bits, and every row of a pass over n tokens has the bits of the one-token
pass (so greedy speculation equals target-only decoding by construction)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from mlxspec.errors import MlxspecError  # noqa: E402
from mlxspec.torchpath import int4, invariant, vnni  # noqa: E402
from tiny import QUANTIZED_BASE, greedy_alone_and_self_drafted, quantized_twin, torch_rows_equal_one_token_passes  # noqa: E402

BASE = QUANTIZED_BASE


@pytest.fixture(autouse=True, params=["torch", "vnni"])
def kernel(request, monkeypatch):
    """Each test on torch's int4 kernel and, where this CPU has it, on ``vnni``'s (the one a
    process here runs: tests/conftest.py loads it)."""
    if request.param == "torch":
        monkeypatch.setattr(vnni, "active", lambda: False)
    elif not vnni.active():
        pytest.skip("the VNNI product kernel needs AVX-512 VNNI on x86-64 Linux")
    return request.param


def quantized_layer(n: int, k: int, group_size: int = 32, bias: bool = False, seed: int = 0) -> mnn.QuantizedLinear:
    mx.random.seed(seed)
    layer = mnn.Linear(k, n, bias=bias)
    return mnn.QuantizedLinear.from_linear(layer, group_size=group_size, bits=4)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_stored_weights_read_back_as_mlx_dequantizes_them(group_size):
    layer = quantized_layer(48, 256, group_size)
    got = int4.Int4Linear.from_mlx(layer).dequantized()
    want = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=group_size, bits=4)
    assert np.array_equal(got.numpy(), np.array(want))


@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_x_times_w_to_bfloat16_rounding(bias):
    layer = quantized_layer(96, 128, bias=bias, seed=1)
    lin = int4.Int4Linear.from_mlx(layer)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    want = x.double() @ lin.dequantized().double().T + (lin.bias.double() if bias else 0)
    got = lin(x)
    assert got.dtype == torch.float32
    # bfloat16 activations, scales and outputs: ~3 significant digits
    assert float((got.double() - want).abs().max() / want.abs().max()) < 2e-2
    mlx_out = np.array(layer(mx.array(x.numpy())))
    assert np.allclose(got.numpy(), mlx_out, rtol=0.05, atol=0.05 * float(want.abs().max()))


def test_fused_columns_have_each_layers_own_bits():
    layers = [int4.Int4Linear.from_mlx(quantized_layer(n, 64, seed=s)) for s, n in enumerate((64, 32, 32))]
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    fused = int4.fuse(layers)(x)
    assert torch.equal(fused, torch.cat([m(x) for m in layers], dim=-1))
    assert int4.fuse([layers[0], torch.nn.Linear(64, 8)]) is None  # a float layer among them: no fusion


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_rows_of_the_default_models_shapes_are_invariant(threads):
    """Row i of an n-row product (n = 1..8) has the bits of the one-row product, for each
    layer shape of SmolLM2-135M (q and o, k and v, gate and up fused, down) at each thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        for n, k in ((576, 576), (960, 576), (3072, 576), (576, 1536)):
            words = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, generator=g)  # any nibbles
            lin = int4.Int4Linear(words, torch.rand(n, k // 32, generator=g) * 0.02,
                                  torch.randn(n, k // 32, generator=g) * 0.1, None, 32)
            x = torch.randn(8, k, generator=g)
            singles = [lin(x[i:i + 1])[0] for i in range(8)]
            for rows in range(1, 9):
                out = lin(x[:rows])
                assert all(torch.equal(out[i], singles[i]) for i in range(rows)), (n, k, rows)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["scales", "biases", "bias"])
def test_a_stored_weight_changed_in_place_is_packed_again(name):
    lin = int4.Int4Linear.from_mlx(quantized_layer(32, 64, bias=True))
    x = torch.randn(2, 64)
    before = lin(x)
    getattr(lin, name).mul_(2)
    fresh = int4.Int4Linear(lin.weight, lin.scales, lin.biases, lin.bias, 32)
    assert not torch.equal(lin(x), before) and torch.equal(lin(x), fresh(x))


def test_a_quantized_model_runs_its_4bit_layers_on_the_kernel_and_the_rest_in_float32():
    mlx_model, model = quantized_twin()
    layers = [m for m in model.modules() if isinstance(m, int4.Int4Linear)]
    assert len(layers) == 7 * BASE["num_layers"]
    assert model.model.embed_tokens.weight.dtype == torch.float32
    emb = mlx_model.model.embed_tokens
    want = mx.dequantize(emb.weight, emb.scales, emb.biases, group_size=32, bits=8)
    assert np.array_equal(model.model.embed_tokens.weight.numpy(), np.array(want))
    ids = [(5 * i + 1) % 48 for i in range(40)]
    with torch.inference_mode():
        got = model(torch.tensor([ids]), None)
    ref = np.array(mlx_model(mx.array([ids]), None).astype(mx.float32))
    assert float(np.abs(got.numpy() - ref).max() / np.abs(ref).max()) < 5e-2


@pytest.mark.parametrize("family", [{}, dict(qkv_bias=True, o_bias=True, mlp_bias=True), dict(tie_embeddings=False)])
def test_every_row_equals_the_one_token_pass_bitwise(family):
    _, model = quantized_twin(1, **family)
    assert invariant.make_batch_invariant(model)
    assert isinstance(model.model.layers[0].self_attn.fused_qkv, int4.Int4Weight)
    ctx = [(7 * i + 3) % 48 for i in range(252)]  # 252 + 8 crosses a KEY_BLOCK of keys
    got = torch_rows_equal_one_token_passes(model, ctx, [11, 4, 30, 2, 47, 19, 8, 25])
    assert all(all(r) for r in got), got


def test_greedy_speculation_emits_the_target_only_tokens():
    _, model = quantized_twin(3, num_layers=3)
    invariant.make_batch_invariant(model)
    alone, drafted = greedy_alone_and_self_drafted(model, (1, 3, 7))
    assert len(alone) == 24 and all(out == alone for out in drafted)


def test_quantized_is_refused_off_the_cpu_and_from_float_weights():
    from types import SimpleNamespace

    from mlxspec.torchpath.load import to_torch, torch_dtype

    assert torch_dtype("quantized", "cpu") == "quantized"
    with pytest.raises(MlxspecError, match="quantized"):
        torch_dtype("quantized", "cuda")
    with pytest.raises(MlxspecError, match="load it as quantized"):
        to_torch(SimpleNamespace(dtype="float32"), "quantized", "cpu")


def test_a_file_without_4bit_layers_runs_float32():
    """--dtype auto on torch's CPU reads weights as stored; where none is 4-bit the target is
    float32, and says so."""
    from pathlib import Path

    from mlxspec.targets.loading import LoadedModel
    from mlxspec.torchpath.load import to_torch
    from tiny import tiny_target

    t = tiny_target()
    got = to_torch(LoadedModel(t.model, t.tokenizer, "tiny", Path("tiny"), "quantized", 64), "auto", "cpu")
    assert got.dtype == "float32" and not any(isinstance(m, int4.Int4Linear) for m in got.model.modules())
    with pytest.raises(MlxspecError, match="load it as float32"):
        to_torch(LoadedModel(t.model, t.tokenizer, "tiny", Path("tiny"), "quantized", 64), "bfloat16", "cpu")


@pytest.mark.model
def test_real_model_on_the_int4_kernel(lm, kernel):
    """The default model as its file stores it: 210 4-bit layers on the kernel (``vnni``'s where
    this CPU has it, its 8-bit head too), a third of the float32 weight bytes, every row of a
    pass bitwise the one-token pass's, and the same greedy start as float32."""
    from mlxspec.targets import loading

    if kernel == "torch" and vnni.supported():
        pytest.skip("a process here loads the VNNI kernel: the real model runs on it")

    q = loading.load("default", backend="auto")  # what the commands load by default on this CPU
    model = q.model
    assert q.backend == "torch:cpu" and q.dtype == "quantized" and model.batch_invariant
    assert isinstance(model.packed_head, int4.QuantizedHead) == vnni.active()
    assert sum(isinstance(m, int4.Int4Linear) for m in model.modules()) == 210
    float32 = loading.load("default", "float32", backend="torch:cpu")
    assert q.weight_bytes_per_token() < 0.4 * float32.weight_bytes_per_token()
    ctx = lm.tokenizer.encode("Explain in two sentences why the moon has phases. " * 12)[:250]
    tokens = lm.tokenizer.encode(" The moon orbits the Earth every month")[:8]
    got = torch_rows_equal_one_token_passes(model, ctx, tokens)
    assert all(all(r) for r in got), got
    with torch.inference_mode():
        logits = model(torch.tensor([ctx[:60]]), None)[0].numpy()
    ref = np.array(lm.model(mx.array([ctx[:60]]), None)[0])
    assert (logits.argmax(-1) == ref.argmax(-1)).mean() > 0.9
    # the default drafter's head reads this target's features; its own products are packed
    from mlxspec.targets.drafts import make_drafter

    head = make_drafter("smollm2-135m-eagle", q, q.dtype).head
    assert isinstance(head.lm_head, invariant.PackedLinear) and head.block.mlp.fused_gate_up is not None
