import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlxspec.core.model import Llama, LlamaConfig, rope_at
from mlxspec.targets import export, loading
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


@pytest.mark.parametrize("tied", [True, False])
def test_logit_rows_are_the_last_rows_and_prefill_asks_for_one(tied, monkeypatch):
    """``logit_rows=n``: the last n rows of the full logits (0: none), the cache as without it;
    chunked prefill asks for none of its earlier chunks' and one row of the last."""
    from mlxspec.core import prefill as prefill_module

    mx.random.seed(1)
    model = Llama(LlamaConfig(**{**TINY.to_dict(), "tie_embeddings": tied}))
    tokens = mx.array([[3, 14, 15, 9, 26, 5, 35]])
    c_full = model.make_cache()
    full = model(tokens, c_full)
    for n in (0, 1, 3):
        cache = model.make_cache()
        part = model(tokens, cache, logit_rows=n)
        assert part.shape == (1, n, TINY.vocab_size)
        if n:
            assert rel_err(part, full[:, 7 - n :]) < 1e-6
        assert all(mx.array_equal(a.state[0], b.state[0]) for a, b in zip(cache, c_full))
    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 3)
    asked, call = [], Llama.__call__
    monkeypatch.setattr(Llama, "__call__", lambda self, *a, **k: asked.append(k.get("logit_rows")) or call(self, *a, **k))
    last = prefill_module.prefill(model, model.make_cache(), tokens[0].tolist())  # chunks of 3, 3 and 1
    assert asked == [0, 0, 1] and rel_err(last, full[0, -1]) < 1e-6


@pytest.mark.model
def test_logits_match_mlx_lm_reference(lm):
    ids = mx.array([encode_prompt(lm.tokenizer, "Name three colours of the rainbow.")])
    ref = export.to_mlx_lm(lm.model)
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
    out = export.export_folder(lm.model, lm.tokenizer, tmp_path / "smol")
    again = loading.load(str(out))
    ids = mx.array([[1, 4093, 198, 6004]])
    assert rel_err(again.model(ids, again.model.make_cache()), lm.model(ids, lm.model.make_cache())) < 1e-6
    text = "Round trip: 42 apples."
    assert again.tokenizer.encode(text, add_special_tokens=False) == lm.tokenizer.encode(text, add_special_tokens=False)
    assert np.array_equal(sorted(again.tokenizer.eos_token_ids), sorted(lm.tokenizer.eos_token_ids))


# ----------------------------------------------------------------------------- the CPU path


def passes(model, tokens: mx.array, lengths: list[int], **kw) -> list[mx.array]:
    """Logits of consecutive passes over ``tokens`` split into ``lengths``, through one cache."""
    cache, out, start = model.make_cache(), [], 0
    for n in lengths:
        out.append(model(tokens[:, start : start + n], cache, **kw))
        start += n
    return out


def both_paths(model, fn):
    """``fn()`` on the CPU path, then on the blocks' own path (the switch restored after)."""
    assert model.cpu_path() is not None
    fast = fn()
    model.use_cpu_path = False
    try:
        return fast, fn()
    finally:
        model.use_cpu_path = True


@pytest.mark.parametrize("traditional", [True, False])
def test_cpu_path_matches_the_blocks_own_path(traditional):
    mx.random.seed(1)
    model = Llama(LlamaConfig(**{**TINY.to_dict(), "rope_traditional": traditional}))
    mx.eval(model.parameters())
    tokens = mx.random.randint(0, TINY.vocab_size, (1, 30))
    lengths = [9, 1, 6, 1, 1, 3, 9]  # a prefill, then verify passes and single tokens
    for kw in ({}, {"num_layers": 1, "return_hidden": True}):  # all layers; self:L with hidden states
        fast, plain = both_paths(model, lambda kw=kw: passes(model, tokens, lengths, **kw))
        for a, b in zip(fast, plain):
            a, b = (a, b) if kw else ((a,), (b,))  # (logits, hidden) or (logits,)
            assert all(rel_err(x, y) < 1e-5 for x, y in zip(a, b))
            assert mx.array_equal(mx.argmax(a[0], -1), mx.argmax(b[0], -1)).item()
    # An explicit mask with per-token positions (tree verification): siblings share a position.
    mask = mx.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=mx.bool_)
    fast, plain = both_paths(model, lambda: model(tokens[:, :4], model.make_cache(), mask=mask,
                                                  positions=mx.array([0, 1, 1, 2])))
    assert rel_err(fast, plain) < 1e-5


def test_cpu_path_reads_the_current_weights():
    mx.random.seed(2)
    model = Llama(TINY)
    tokens = mx.array([[3, 14, 15]])
    model(tokens, model.make_cache())  # the path exists and has traced
    new = {"model.layers.0.self_attn.k_proj.weight": mx.random.normal(model.layers[0].self_attn.k_proj.weight.shape)}
    model.load_weights(list(new.items()), strict=False)
    fast, plain = both_paths(model, lambda: model(tokens, model.make_cache()))
    assert rel_err(fast, plain) < 1e-6


def test_quantized_blocks_run_their_own_path():
    model = Llama(TINY)
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p.endswith(("gate_proj", "up_proj")))
    assert model.cpu_path() is None
    model = Llama(TINY)
    model.use_cpu_path = False
    assert model.cpu_path() is None


@pytest.mark.model
def test_real_model_cpu_path_matches_the_blocks_own_path(lm):
    """The loaded target runs the CPU path; its logits stay within 1e-5 of the blocks' own path
    for a prefill and verify passes of 1..8 tokens, with the same argmax everywhere."""
    ids = encode_prompt(lm.tokenizer, "Name three colours of the rainbow.")
    tokens = mx.array([ids + [(97 * i) % lm.config.vocab_size for i in range(36)]])
    lengths = [len(ids)] + list(range(1, 9))
    fast, plain = both_paths(lm.model, lambda: passes(lm.model, tokens, lengths))
    for a, b in zip(fast, plain):
        assert rel_err(a, b) < 1e-5
        assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1)).item()
