"""The batch-invariant torch pass (``mlxspec/torchpath/invariant.py``): every row of a pass over
n tokens has the bits of the one-token pass at that position (n = 1..8), so greedy speculation
equals target-only decoding by construction. The plain path is checked too, so the test shows
it can fail: the plain path's rows differ."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from mlxspec.core.model import LlamaConfig  # noqa: E402
from mlxspec.torchpath import invariant  # noqa: E402
from tiny import (  # noqa: E402
    TWIN_BASE, TWIN_FAMILIES, greedy_alone_and_self_drafted, torch_rows_equal_one_token_passes, torch_twin,
)

BASE = TWIN_BASE
TOKENS = [11, 4, 30, 2, 47, 19, 8, 25]
FAMILIES = {
    **TWIN_FAMILIES,
    "no-gqa": dict(num_kv_heads=4),  # one query row per key head: padded to MIN_ROWS
    "mqa": dict(num_kv_heads=1),  # one key head: a lone matrix, padded to two
    "long-down": dict(intermediate_size=1100),  # oneDNN's one-row path differs past 1,024; SiLU's tail
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("context", [1, 5, 252])  # 252 + 8 crosses a KEY_BLOCK of keys
def test_every_row_equals_the_one_token_pass_bitwise(family, context):
    model = torch_twin(**FAMILIES[family])
    assert invariant.make_batch_invariant(model)
    ctx = [(7 * i + 3) % 48 for i in range(context)]
    got = torch_rows_equal_one_token_passes(model, ctx, TOKENS)
    assert all(all(r) for r in got), got


@pytest.mark.parametrize("threads", [1, 3])
def test_invariant_at_other_thread_counts(threads):
    """The engine may run torch on fewer threads when cores are busy: each setting is invariant."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = torch_twin(2)
        invariant.make_batch_invariant(model)
        got = torch_rows_equal_one_token_passes(model, [(3 * i + 1) % 48 for i in range(252)], TOKENS)
    finally:
        torch.set_num_threads(before)
    assert all(all(r) for r in got), got


def test_greedy_speculation_emits_the_target_only_tokens():
    """What the invariance is for: with a drafter (the target's first layer) and any K, greedy
    output is the target-only output."""
    model = torch_twin(3, num_layers=3)
    invariant.make_batch_invariant(model)
    alone, drafted = greedy_alone_and_self_drafted(model, (1, 3, 7))
    assert len(alone) == 24 and all(out == alone for out in drafted)


def test_the_plain_path_is_not_batch_invariant():
    """The check above can fail: today's kernels (MKL, fused attention) give other bits."""
    model = torch_twin(**FAMILIES["long-down"])
    got = torch_rows_equal_one_token_passes(model, [(7 * i + 3) % 48 for i in range(40)], TOKENS)
    assert not all(all(r) for r in got)


def test_invariant_pass_matches_the_plain_one_to_float_rounding():
    model = torch_twin(1, **FAMILIES["head_dim+bias"])
    ids = torch.tensor([[(5 * i + 1) % 48 for i in range(300)]])
    with torch.inference_mode():
        plain = model(ids, model.make_cache())
        invariant.make_batch_invariant(model)
        packed = model(ids, model.make_cache())
    assert float((plain - packed).abs().max() / plain.abs().max()) < 1e-5


def test_chunked_attention_is_attention_with_masks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((6, 5), (2, 300), (2, 300)))
    mask = torch.rand(5, 300, generator=g) < 0.7
    mask[:, 0] = True
    want = invariant.sdpa(q, k, v, mask, 0.25)
    got = invariant.chunked_attention(q, k, v, mask, 0.25)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)


def test_chunked_attention_takes_a_mask_per_row():
    """Batched generation's left padding: a (B, 1, L, S) mask, each row its own."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, h, n, 16, generator=g) for h, n in ((6, 4), (2, 40), (2, 40)))
    mask = torch.rand(3, 1, 4, 40, generator=g) < 0.7
    mask[..., 0] = True
    want = invariant.sdpa(q, k, v, mask, 0.25)
    assert torch.allclose(invariant.chunked_attention(q, k, v, mask, 0.25), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_attention_reads_the_caches_buffer_in_place_whatever_lies_past_the_keys(batch):
    """The keys and values a cache returns are views of buffers allocated 256 positions at a
    time; attention reads the masked positions past them in place. After a trim those hold
    stale keys, which must add exact zeros, as the zero padding of a bare tensor does."""
    from mlxspec.torchpath.cache import KVCache

    g = torch.Generator().manual_seed(2)
    cache = KVCache()
    cache.update_and_fetch(*(torch.randn(batch, 2, 290, 16, generator=g) * 10 for _ in range(2)))
    cache.trim(30)  # positions 260..289 now hold stale keys and values
    k, v = cache.update_and_fetch(*(torch.randn(batch, 2, 1, 16, generator=g) for _ in range(2)))
    assert invariant._widened(k, 512).data_ptr() == k.data_ptr()  # no copy
    q = torch.randn(batch, 6, 1, 16, generator=g)
    in_place = invariant.chunked_attention(q, k, v, None, 0.25)
    assert torch.equal(in_place, invariant.chunked_attention(q, k.clone(), v.clone(), None, 0.25))
    assert torch.allclose(in_place, invariant.sdpa(q, k, v, None, 0.25), atol=1e-4)  # values ~10


def test_a_pass_builds_its_attention_bias_once_and_models_keep_their_own(monkeypatch):
    built = []
    original = invariant.MaskBiases.get

    def counted(self, mask, *args):
        before = self.last
        bias = original(self, mask, *args)
        if self.last is not before:
            built.append(self)
        return bias

    monkeypatch.setattr(invariant.MaskBiases, "get", counted)
    models = [torch_twin(seed) for seed in (0, 1)]
    for m in models:
        assert invariant.make_batch_invariant(m)
    with torch.inference_mode():
        cache = models[0].make_cache()
        models[0](torch.tensor([TOKENS]), cache)  # one pass, every layer
        assert len(built) == 1
        models[1](torch.tensor([TOKENS[:3]]), models[1].make_cache())
        models[0](torch.tensor([TOKENS[:1]]), cache)
    assert len(built) == 3 and built[1] is not built[0] and built[2] is built[0]


def test_prefill_runs_the_head_on_its_last_position_only_with_the_same_bits(monkeypatch):
    """``logit_rows``: prefill's chunks skip the 49,152-word head but for the last position, whose
    logits keep the bits the whole prompt in one pass gives it, as do the hidden states."""
    from mlxspec.core import prefill as prefill_module
    from mlxspec.torchpath import ops as torch_ops

    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 8)
    model = torch_twin()
    assert invariant.make_batch_invariant(model)
    rows, head = [], model.head
    monkeypatch.setattr(model, "head", lambda h: rows.append(h.shape[1]) or head(h))
    ids = [(7 * i + 3) % 48 for i in range(21)]  # chunks of 8, 8 and 5
    with torch.inference_mode():
        last, hidden = torch_ops.prefill(model, model.make_cache(), ids, return_hidden=True)
        assert rows == [1]
        logits, h = model(torch.tensor([ids]), model.make_cache(), return_hidden=True)
    assert torch.equal(last, logits[0, -1]) and torch.equal(hidden, h[0])


def test_rope_rotates_as_mlx_does():
    """``Rope.rotate``'s one-pass form against ``mx.fast.rope``, both layouts."""
    from mlxspec.torchpath.model import Rope

    for traditional in (False, True):
        cfg = LlamaConfig(**{**BASE, "rope_traditional": traditional})
        rope, x = Rope(cfg, "cpu"), mx.random.normal((1, 3, 5, cfg.head_dim))
        want = mx.fast.rope(x, cfg.head_dim, traditional=traditional, base=cfg.rope_theta, scale=1.0, offset=7)
        cos, sin = rope.tables(torch.arange(7, 12), torch.float32)
        got = rope.rotate(torch.from_numpy(np.array(x)), cos, sin)
        assert torch.allclose(got, torch.from_numpy(np.array(want)), atol=1e-5)


@pytest.mark.parametrize("name", ["mlp.down_proj.weight", "self_attn.k_proj.weight", "mlp.up_proj.weight",
                                  "self_attn.v_proj.bias"])
def test_a_weight_changed_in_place_is_packed_again(name):
    """Every packed copy follows its weights, the fused ones (q, k, v; gate, up) too: the pass
    after an in-place change is the pass of a model packed after it."""
    family = FAMILIES["head_dim+bias"] if name.endswith("bias") else {}
    model, fresh = torch_twin(**family), torch_twin(**family)
    invariant.make_batch_invariant(model)
    ids = torch.tensor([[3, 9, 4, 1]])
    with torch.inference_mode():
        before = model(ids, None)
    with torch.no_grad():
        for m in (model, fresh):
            m.model.layers[1].get_parameter(name).mul_(1.5)
    invariant.make_batch_invariant(fresh)
    with torch.inference_mode():
        after = model(ids, None)
        assert not torch.equal(after, before) and torch.equal(after, fresh(ids, None))


def test_parameters_keep_their_names_and_other_dtypes_are_left_alone():
    model = torch_twin()
    names = list(model.state_dict())
    assert invariant.make_batch_invariant(model)
    assert list(model.state_dict()) == names
    half = torch_twin().to(torch.float16)
    assert not invariant.make_batch_invariant(half)
    assert half.packed_head is None


@pytest.mark.model
def test_real_model_rows_equal_one_token_passes_bitwise(lm):
    from mlxspec.torchpath.load import to_torch

    model = to_torch(lm, "float32", "cpu").model  # float32 on the CPU: the invariant kernels
    assert model.batch_invariant
    ctx = lm.tokenizer.encode("Explain in two sentences why the moon has phases. " * 12)[:250]
    tokens = lm.tokenizer.encode(" The moon orbits the Earth every month")[:8]
    got = torch_rows_equal_one_token_passes(model, ctx, tokens)
    assert all(all(r) for r in got), got


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_a_drafts_linears_packed_keep_their_names_and_its_output(dtype, tol):
    """``pack_linears`` (a drafter's products through oneDNN, q/k/v and gate/up fused) is a
    speed change only: the same parameters, the same logits to the packed dtype's rounding."""
    model = torch_twin(4, **FAMILIES["head_dim+bias"])
    names = list(model.state_dict())
    ids = torch.tensor([[(3 * i + 2) % 48 for i in range(30)]])
    with torch.inference_mode():
        plain = model(ids, model.make_cache())
        assert invariant.pack_linears(model, dtype)
        packed = model(ids, model.make_cache())
    assert list(model.state_dict()) == names
    assert isinstance(model.model.layers[0].self_attn.q_proj, invariant.PackedLinear)
    assert model.model.layers[0].mlp.fused_gate_up.dtype == dtype
    assert packed.dtype == torch.float32
    assert float((plain - packed).abs().max() / plain.abs().max()) < tol
    assert not invariant.pack_linears(torch_twin().to(torch.float16))
