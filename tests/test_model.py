import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.core.model import Llama, LlamaConfig, rope_at
from mlxspec.targets import loading
from mlxspec.targets.tokenizer import encode_prompt

TINY = LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   intermediate_size=48, rope_theta=10000.0)


def rel_err(a: mx.array, b: mx.array) -> float:
    return (mx.abs(a - b).max() / mx.abs(b).max()).item()


@pytest.mark.parametrize("traditional", [True, False])
def test_rope_at_matches_fast_rope(traditional):
    x = mx.random.normal((1, 3, 5, 16))
    fast = mx.fast.rope(x, 16, traditional=traditional, base=10000.0, scale=1.0, offset=7)
    ours = rope_at(x, mx.arange(7, 12), 10000.0, traditional)
    assert rel_err(ours, fast) < 1e-5


@pytest.mark.parametrize("traditional", [True, False])
def test_explicit_mask_and_positions_equal_causal_decoding(traditional):
    mx.random.seed(0)
    model = Llama(LlamaConfig(**{**TINY.to_dict(), "rope_traditional": traditional}))
    tokens = mx.array([[3, 14, 15, 9, 26, 5]])
    base = model(tokens, model.make_cache())
    causal = mx.tril(mx.ones((6, 6), dtype=mx.bool_))
    explicit = model(tokens, model.make_cache(), mask=causal, positions=mx.arange(6))
    assert rel_err(explicit, base) < 1e-5
    # The same sequence one token at a time through the cache.
    cache = model.make_cache()
    steps = mx.concatenate([model(tokens[:, i : i + 1], cache) for i in range(6)], axis=1)
    assert rel_err(steps, base) < 1e-5


def test_first_layers_only():
    model = Llama(TINY)
    tokens = mx.array([[1, 2, 3]])
    out = model(tokens, model.make_cache(), num_layers=1)
    assert out.shape == (1, 3, TINY.vocab_size)
    assert rel_err(out, model(tokens, model.make_cache())) > 1e-3


@pytest.mark.model
def test_logits_match_mlx_lm_reference(lm):
    ids = mx.array([encode_prompt(lm.tokenizer, "Name three colours of the rainbow.")])
    ref = loading.to_mlx_lm(lm.model)
    ours = lm.model(ids, lm.model.make_cache())
    theirs = ref(ids, cache=make_prompt_cache(ref))
    assert rel_err(ours, theirs) < 1e-4
    # and incrementally, one token after the prompt
    c1, c2 = lm.model.make_cache(), make_prompt_cache(ref)
    lm.model(ids, c1), ref(ids, cache=c2)
    nxt = mx.array([[42]])
    assert rel_err(lm.model(nxt, c1), ref(nxt, cache=c2)) < 1e-4


@pytest.mark.model
def test_quantized_weights_agree_with_float32(lm):
    q = loading.load("default", dtype="quantized")
    assert any(k.endswith(".scales") for k, _ in tree_flatten(q.model.parameters()))
    ids = mx.array([encode_prompt(lm.tokenizer, "The sky is")])
    a = q.model(ids, q.model.make_cache())[0, -1]
    b = lm.model(ids, lm.model.make_cache())[0, -1]
    # Both are the same Q4_1 numbers; only the order of float operations differs.
    assert rel_err(a, b) < 1e-2
    assert int(mx.argmax(a)) == int(mx.argmax(b))


@pytest.mark.model
def test_export_folder_round_trip(lm, tmp_path):
    out = loading.export_folder(lm.model, lm.tokenizer, tmp_path / "smol")
    again = loading.load(str(out))
    ids = mx.array([[1, 4093, 198, 6004]])
    assert rel_err(again.model(ids, again.model.make_cache()), lm.model(ids, lm.model.make_cache())) < 1e-6
    text = "Round trip: 42 apples."
    assert again.tokenizer.encode(text, add_special_tokens=False) == lm.tokenizer.encode(text, add_special_tokens=False)
    assert np.array_equal(sorted(again.tokenizer.eos_token_ids), sorted(lm.tokenizer.eos_token_ids))


# ----------------------------------------------------------------------------- the fused CPU path


def passes(model, tokens: mx.array, lengths: list[int], **kw) -> list[mx.array]:
    """Logits of consecutive passes over ``tokens`` split into ``lengths``, through one cache."""
    cache, out, start = model.make_cache(), [], 0
    for n in lengths:
        out.append(model(tokens[:, start : start + n], cache, **kw))
        start += n
    return out


@pytest.mark.parametrize("traditional", [True, False])
def test_fused_path_matches_the_plain_path(traditional):
    mx.random.seed(1)
    model = Llama(LlamaConfig(**{**TINY.to_dict(), "rope_traditional": traditional}))
    mx.eval(model.parameters())
    names = {k: mx.array(v) for k, v in tree_flatten(model.parameters())}
    tokens = mx.random.randint(0, TINY.vocab_size, (1, 30))
    lengths = [9, 1, 6, 1, 1, 3, 9]  # a prefill, then verify passes and single tokens
    model.use_fused_path = False
    plain = passes(model, tokens, lengths)
    assert model.fuse_projections() and model.fused_path() is None  # switched off
    model.use_fused_path = True
    assert model.fused_path() is not None
    # Same parameter names and values: saving, self:L, export and draft init see no change.
    after = dict(tree_flatten(model.parameters()))
    assert after.keys() == names.keys() and all(mx.array_equal(after[k], v).item() for k, v in names.items())
    for a, b in zip(passes(model, tokens, lengths), plain):
        assert rel_err(a, b) < 1e-5
        assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1)).item()
    # First layers only (self:L) with hidden states, and an explicit mask with positions (trees).
    fused = passes(model, tokens, lengths, num_layers=1, return_hidden=True)
    causal = mx.tril(mx.ones((6, 6), dtype=mx.bool_))
    explicit = model(tokens[:, :6], model.make_cache(), mask=causal, positions=mx.arange(6))
    model.use_fused_path = False
    for a, b in zip(fused, passes(model, tokens, lengths, num_layers=1, return_hidden=True)):
        assert rel_err(a[0], b[0]) < 1e-5 and rel_err(a[1], b[1]) < 1e-5
    assert rel_err(explicit, plain[0][:, :6]) < 1e-5


def test_replaced_weights_leave_the_fused_path():
    mx.random.seed(2)
    model = Llama(TINY)
    model.fuse_projections()
    tokens = mx.array([[3, 14, 15]])
    new = {"model.layers.0.self_attn.k_proj.weight": mx.random.normal(model.layers[0].self_attn.k_proj.weight.shape)}
    model.load_weights(list(new.items()), strict=False)
    assert model.fused_path() is None  # stale fused weights are never used
    again = Llama(TINY)
    again.update(model.parameters())
    assert rel_err(model(tokens, model.make_cache()), again(tokens, again.make_cache())) < 1e-6


def test_quantized_projections_stay_unfused():
    model = Llama(TINY)
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p.endswith(("gate_proj", "up_proj")))
    assert not model.fuse_projections() and model.fused_path() is None


@pytest.mark.model
def test_fused_real_model_matches_unfused(lm):
    """The loaded target runs fused; its logits stay within 1e-5 of the unfused path, for a
    prefill and verify passes of 1..8 tokens, with the same argmax everywhere."""
    assert lm.model.fused_path() is not None
    ids = encode_prompt(lm.tokenizer, "Name three colours of the rainbow.")
    tokens = mx.array([ids + [(97 * i) % lm.config.vocab_size for i in range(36)]])
    lengths = [len(ids)] + list(range(1, 9))
    fused = passes(lm.model, tokens, lengths)
    lm.model.use_fused_path = False
    try:
        plain = passes(lm.model, tokens, lengths)
    finally:
        lm.model.use_fused_path = True
    for a, b in zip(fused, plain):
        assert rel_err(a, b) < 1e-5
        assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1)).item()
