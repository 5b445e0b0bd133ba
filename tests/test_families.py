"""The model families our own module implements (issue 11), against mlx-lm 0.32's own classes.

Each test model is a tiny random one built with mlx-lm's class for its family and saved as an
mlx-lm folder, offline; ours loads the folder and must give mlx-lm's logits, at 8 tokens and at
2,048 (past the scaled-RoPE models' original context of 256, so the scaling matters), and keep
them with per-token positions, tree masks, a cache fed token by token, and speculation.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Status, Step
from mlxspec.core.model import Llama, LlamaConfig, layer_rope, rope_at
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError, UnsupportedArchitecture
from mlxspec.targets import export, families, gguf_model, loading

VOCAB = 128
BASE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB, max_position_embeddings=4096)
# Llama 3.1's scaling with a short original context, so that 2,048 tokens go well past it.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
FAMILIES = {
    "llama3": dict(BASE, model_type="llama", rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
    "linear": dict(BASE, model_type="llama", rope_scaling={"type": "linear", "factor": 4.0}),
    # Mistral-Nemo style: heads wider than hidden / heads; llama's attention and MLP biases.
    "head_dim": dict(BASE, model_type="mistral", head_dim=32, attention_bias=True, mlp_bias=True,
                     tie_word_embeddings=False),
    "qwen2": dict(BASE, model_type="qwen2", rope_theta=1000000.0),
    "qwen3": dict(BASE, model_type="qwen3", head_dim=32, rope_theta=1000000.0, tie_word_embeddings=False),
    # Phi-4-mini style: RoPE on 3/4 of each head, long-context factors with their x-scaling.
    "phi3": dict(BASE, model_type="phi3", partial_rotary_factor=0.75, original_max_position_embeddings=256,
                 rope_scaling={"type": "longrope", "short_factor": [1.0] * 6,
                               "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0]}),
    "gemma2": dict(BASE, model_type="gemma2", head_dim=16, query_pre_attn_scalar=24,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    # Sliding layers 0 and 2 (window 16), a global one between with linear RoPE scaling.
    "gemma3": dict(BASE, model_type="gemma3_text", num_hidden_layers=3, head_dim=16, num_key_value_heads=1,
                   query_pre_attn_scalar=24, sliding_window=16, sliding_window_pattern=2,
                   rope_theta=1000000.0, rope_local_base_freq=10000.0,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}),
}
GREEDY = SamplingParams()


def rel_err(a: mx.array, b: mx.array) -> float:
    return (mx.abs(a - b).max() / mx.abs(b).max()).item()


def save_tokenizer(folder: Path) -> None:
    """A character-level tokenizer, eos ``</s>``: ``load_folder`` needs one."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, **{chr(c): c - 30 for c in range(32, 127)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(str(folder))


def mlx_lm_model(config: dict, seed: int) -> nn.Module:
    """mlx-lm's own model for ``config``, random, with norms away from their initial ones (so a
    norm read wrongly, e.g. Gemma's 1 + w, shows). Gemma 3's head is tied as its loader ties it."""
    mx.random.seed(seed)
    mt = {"mistral": "llama"}.get(config["model_type"], config["model_type"])
    arch = importlib.import_module(f"mlx_lm.models.{mt}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    if mt == "gemma3_text":
        model.sanitize({})  # no lm_head in the checkpoint: tied
    norms = [(k, mx.random.uniform(0.5, 1.5, v.shape)) for k, v in tree_flatten(model.parameters())
             if k.endswith("norm.weight")]
    model.load_weights(norms, strict=False)
    mx.eval(model.parameters())
    return model


def save_folder(folder: Path, config: dict, model: nn.Module, extra: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 1}))
    mx.save_safetensors(str(folder / "model.safetensors"), {**dict(tree_flatten(model.parameters())), **(extra or {})})
    save_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """name -> (mlx-lm's model, ours loaded from its folder), built once per name."""
    root, made = tmp_path_factory.mktemp("families"), {}

    def get(name: str) -> tuple[nn.Module, Llama]:
        if name not in made:
            ref = mlx_lm_model(FAMILIES[name], seed=list(FAMILIES).index(name))
            ours, _, _ = loading.load_folder(save_folder(root / name, FAMILIES[name], ref), "float32")
            made[name] = ref, ours
        return made[name]

    return get


def tokens(n: int, seed: int = 0) -> mx.array:
    return mx.random.randint(2, VOCAB, (1, n), key=mx.random.key(seed))


# ----------------------------------------------------------------------------- logits vs mlx-lm


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("length", [8, 2048])
def test_logits_match_mlx_lm(family, name, length):
    ref, ours = family(name)
    ids = tokens(length)
    theirs = ref(ids)
    assert rel_err(ours(ids, ours.make_cache()), theirs) < 1e-4
    if length == 8:  # no cache: training and scoring
        assert rel_err(ours(ids, None), theirs) < 1e-4


@pytest.mark.parametrize("name", ["llama3", "linear", "head_dim", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"])
def test_the_reference_copy_matches_too(family, name):
    """``to_mlx_lm`` rebuilds mlx-lm's class from our config: it must keep every feature (the
    RoPE scaling above all) so that reference checks and benchmarks compare like with like."""
    _, ours = family(name)
    ids = tokens(300)
    assert rel_err(export.to_mlx_lm(ours)(ids), ours(ids, ours.make_cache())) < 1e-4


def test_llama3_scaling_matters_and_keeps_the_cpu_path(family):
    ref, ours = family("llama3")
    assert ours.cpu_path() is not None  # scaled frequencies are just another RoPE table there
    unscaled = dict(FAMILIES["llama3"], rope_scaling=None)
    plain = mlx_lm_model(unscaled, seed=0)
    plain.load_weights(list(tree_flatten(ref.parameters())))
    ids = tokens(512)
    assert rel_err(plain(ids), ref(ids)) > 1e-2  # the test would see a dropped scaling
    ours.use_cpu_path = False
    try:
        blocks = ours(ids, ours.make_cache())
    finally:
        ours.use_cpu_path = True
    assert rel_err(ours(ids, ours.make_cache()), blocks) < 1e-5


def test_only_llama_blocks_take_the_cpu_path(family):
    assert family("linear")[1].cpu_path() is not None
    for name in ("head_dim", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"):  # biases, norms, partial RoPE...
        assert family(name)[1].cpu_path() is None, name


def test_a_tied_checkpoint_with_a_stray_lm_head_loads(tmp_path):
    """Some tied checkpoints still carry ``lm_head.weight``; mlx-lm's sanitize drops it."""
    config = dict(BASE, model_type="llama", tie_word_embeddings=True)
    ref = mlx_lm_model(config, seed=5)
    stray = {"lm_head.weight": mx.random.normal((VOCAB, 64)),
             "model.layers.0.self_attn.rotary_emb.inv_freq": mx.ones((8,))}
    ours, _, _ = loading.load_folder(save_folder(tmp_path / "tied", config, ref, stray), "float32")
    assert ours.cfg.tie_embeddings and "lm_head" not in ours
    ids = tokens(8)
    assert rel_err(ours(ids, ours.make_cache()), ref(ids)) < 1e-4


def test_rope_settings_nested_as_transformers_5_writes_them_are_read():
    nested = dict(BASE, model_type="llama", rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0})
    cfg, direct = families.config_from_mlx_lm(nested), families.config_from_mlx_lm(FAMILIES["llama3"])
    assert cfg.rope_theta == direct.rope_theta == 500000.0
    assert mx.array_equal(layer_rope(cfg).periods, layer_rope(direct).periods).item()


# ----------------------------------------------------------------------------- positions, trees, caches


@pytest.mark.parametrize("name", list(FAMILIES))
def test_positions_trees_and_token_by_token_agree_with_one_pass(family, name):
    _, ours = family(name)
    ids = tokens(24, seed=1)  # past gemma3's window of 16
    one = ours(ids, ours.make_cache())
    explicit = ours(ids, ours.make_cache(), mask=mx.tril(mx.ones((24, 24), dtype=mx.bool_)), positions=mx.arange(24))
    assert rel_err(explicit, one) < 1e-5
    cache = ours.make_cache()
    steps = mx.concatenate([ours(ids[:, :20], cache)] + [ours(ids[:, i : i + 1], cache) for i in range(20, 24)], axis=1)
    assert rel_err(steps, one) < 1e-5
    # A tree after a 20-token prefix: node 2 is node 1's sibling (same position), node 3 node 1's child.
    cache = ours.make_cache()
    ours(ids[:, :20], cache)
    a, b, c, d = (int(t) for t in ids[0, 20:24])
    tree = mx.array([[a, b, c, d]])
    mask = mx.concatenate([mx.ones((4, 20), dtype=mx.bool_),
                           mx.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=mx.bool_)], axis=1)
    got = ours(tree, cache, mask=mask, positions=mx.array([20, 21, 21, 22]))
    prefix = ids[0, :20].tolist()
    as_chain = {2: prefix + [a, c], 3: prefix + [a, b, d]}
    for node, seq in as_chain.items():
        assert rel_err(got[0, node], ours(mx.array([seq]), ours.make_cache())[0, -1]) < 1e-5


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_at_with_scaled_frequencies_matches_fast_rope(traditional):
    periods = 10000.0 ** (mx.arange(0, 16, 2) / 16) * mx.array([1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 8.0, 8.0])
    x = mx.random.normal((1, 3, 5, 16))
    fast = mx.fast.rope(x, 16, traditional=traditional, base=None, scale=1.0, offset=300, freqs=periods)
    assert rel_err(rope_at(x, mx.arange(300, 305), 10000.0, traditional, periods), fast) < 1e-5
    partial = mx.fast.rope(x, 12, traditional=traditional, base=10000.0, scale=1.0, offset=300)
    assert rel_err(rope_at(x, mx.arange(300, 305), 10000.0, traditional, dims=12), partial) < 1e-5


# ----------------------------------------------------------------------------- quantized folders


QUANT_BASE = dict(BASE, model_type="qwen2", hidden_size=128, intermediate_size=256, rope_theta=1000000.0)
# Kept quantized, ours runs the very same quantized matmuls as mlx-lm's model: 1e-4 as for float
# models (measured: bitwise equal). Dequantized to float32, it multiplies the same numbers in
# another order (a float matmul instead of the fused quantized kernel): measured 3-6e-7, so 1e-5.
# That is tight enough to matter: here even 8-bit weights differ from the unquantized model by
# ~1e-2, and 4-bit ones (or a misread group size, width or mode) by ~1e-1.
DEQUANTIZED_TOL = 1e-5
QUANTS = {
    "4bit-g64": {"group_size": 64, "bits": 4},
    "8bit-g128": {"group_size": 128, "bits": 8},
    "mxfp4": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("quantized"), {}

    def get(name: str) -> tuple[nn.Module, Path]:
        if name not in made:
            q = QUANTS[name]
            ref = mlx_lm_model(QUANT_BASE, seed=7)
            nn.quantize(ref, **q)
            made[name] = ref, save_folder(root / name, {**QUANT_BASE, "quantization": q}, ref)
        return made[name]

    return get


@pytest.mark.parametrize("name", list(QUANTS))
@pytest.mark.parametrize("dtype", ["quantized", "float32"])
def test_quantized_folders_match_the_quantized_mlx_lm_model(quantized, name, dtype):
    ref, folder = quantized(name)
    ours, _, _ = loading.load_folder(folder, dtype)
    params = dict(tree_flatten(ours.parameters()))
    assert any(k.endswith(".scales") for k in params) == (dtype == "quantized")
    ids = tokens(64)
    tol = 1e-4 if dtype == "quantized" else DEQUANTIZED_TOL
    assert rel_err(ours(ids, ours.make_cache()), ref(ids)) < tol


def test_per_layer_quantization_overrides_are_read(tmp_path):
    """mlx-lm's mixed recipes name some layers' own settings in config.json's quantization."""
    override = {"group_size": 32, "bits": 8}
    q = {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": override}
    ref = mlx_lm_model(QUANT_BASE, seed=8)
    nn.quantize(ref, class_predicate=lambda p, m: hasattr(m, "to_quantized") and (
        override if p == "model.layers.0.mlp.down_proj" else {"group_size": 64, "bits": 4}))
    folder = save_folder(tmp_path / "mixed", {**QUANT_BASE, "quantization": q}, ref)
    ids = tokens(16)
    for dtype, tol in (("quantized", 1e-4), ("float32", DEQUANTIZED_TOL)):
        ours, _, _ = loading.load_folder(folder, dtype)
        assert rel_err(ours(ids, ours.make_cache()), ref(ids)) < tol


def test_quantized_phi3_splits_its_fused_projections(tmp_path):
    config = dict(FAMILIES["phi3"], hidden_size=128, intermediate_size=256, num_attention_heads=8)
    ref = mlx_lm_model(config, seed=9)
    nn.quantize(ref, group_size=64, bits=4)
    folder = save_folder(tmp_path / "phi3q", {**config, "quantization": {"group_size": 64, "bits": 4}}, ref)
    ours, _, _ = loading.load_folder(folder, "quantized")
    assert "qkv_proj" not in ours.layers[0].self_attn and ours.layers[0].self_attn.k_proj.bits == 4
    ids = tokens(16)
    assert rel_err(ours(ids, ours.make_cache()), ref(ids)) < 1e-4
    assert rel_err(export.to_mlx_lm(ours)(ids), ref(ids)) < 1e-4  # fused again for mlx-lm


def test_export_folder_round_trips_a_family(family, tmp_path):
    from mlx_lm.utils import load_tokenizer

    _, ours = family("qwen3")
    folder = tmp_path / "tok"
    folder.mkdir()
    save_tokenizer(folder)
    tok = load_tokenizer(folder, eos_token_ids=[1])
    again, _, _ = loading.load_folder(export.export_folder(ours, tok, tmp_path / "out"), "float32")
    ids = tokens(32)
    assert rel_err(again(ids, again.make_cache()), ours(ids, ours.make_cache())) < 1e-6


# ----------------------------------------------------------------------------- GGUF's llama3 RoPE


def test_gguf_rope_freqs_are_the_llama3_scaling():
    """llama.cpp stores Llama 3's scaling as ``rope_freqs``: per-pair divisors of the frequency.
    Given those, our RoPE is mlx-lm's Llama3RoPE."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    dims, base = 16, 500000.0
    plain = base ** (mx.arange(0, dims, 2) / dims)
    ref = Llama3RoPE(dims, 4096, True, base, LLAMA3_ROPE)  # GGUF: the interleaved rotation
    factors = (ref._freqs / plain).tolist()  # what convert_hf_to_gguf writes
    cfg = gguf_model.config_from_gguf(_gguf_meta(), has_output=False, rope_factors=factors)
    x = mx.random.normal((1, 4, 6, dims))
    ours = Llama(cfg).layers[0].self_attn.rope
    want = ref(x, offset=1000)
    assert rel_err(ours(x, 1000, None), want) < 1e-5
    assert rel_err(ours(x, 0, mx.arange(1000, 1006)), want) < 1e-5


def _gguf_meta() -> dict:
    a = "llama"
    ints = {"embedding_length": 64, "block_count": 1, "attention.head_count": 4, "attention.head_count_kv": 2,
            "feed_forward_length": 128, "context_length": 4096, "vocab_size": VOCAB}
    meta = {f"{a}.{k}": mx.array(v) for k, v in ints.items()}
    meta.update({"general.architecture": a, f"{a}.attention.layer_norm_rms_epsilon": mx.array(1e-5),
                 f"{a}.rope.freq_base": mx.array(500000.0)})
    return meta


def test_a_gguf_with_rope_freqs_loads(tmp_path, monkeypatch):
    """The tensor itself is accepted (it used to end in 'unexpected tensor') and becomes the
    model's RoPE frequencies; the rest of the file loads as before."""
    model = Llama(gguf_model.config_from_gguf(_gguf_meta(), has_output=False))
    mx.eval(model.parameters())
    names = {v: k for k, v in gguf_model._GGUF_NAMES.items()}
    blocks = {v: k for k, v in gguf_model._GGUF_BLOCK_NAMES.items()}

    def gguf_name(ours: str) -> str:
        base, _, suffix = ours.rpartition(".")
        if base in names:
            return f"{names[base]}.{suffix}"
        _, _, i, rest = base.split(".", 3)
        return f"blk.{i}.{blocks[rest]}.{suffix}"

    tensors = {gguf_name(k): v for k, v in tree_flatten(model.parameters())}
    tensors["rope_freqs.weight"] = mx.array([1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0])
    path = tmp_path / "llama3.gguf"
    mx.save_gguf(str(path), tensors, _gguf_meta())
    monkeypatch.setattr(gguf_model, "tokenizer_from_gguf", lambda meta: None)
    loaded, _, _ = gguf_model.load_gguf(path, "float32")
    assert loaded.cfg.rope_scaling["factors"] == [1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    ids = tokens(40)
    assert rel_err(export.to_mlx_lm(loaded)(ids), loaded(ids, loaded.make_cache())) < 1e-4


# ----------------------------------------------------------------------------- speculation


def emitted(events) -> list[int]:
    return [t for e in events if isinstance(e, Step) for t in e.emitted]


def padded_copy(model: Llama, vocab: int) -> Llama:
    """``model`` with its embedding table (and head) padded to ``vocab`` rows, as mlx-community
    drafts often are: same tokens, a larger table."""
    cfg = LlamaConfig(**{**model.cfg.to_dict(), "vocab_size": vocab})
    big = Llama(cfg)
    params = dict(tree_flatten(model.parameters()))
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        if k in params:
            w = params[k]
            params[k] = mx.concatenate([w, mx.zeros((vocab - w.shape[0], w.shape[1]), w.dtype)])
    big.load_weights(list(params.items()), strict=True)
    mx.eval(big.parameters())
    return big


@pytest.mark.parametrize("name", ["llama3", "qwen2", "phi3", "gemma3"])
def test_greedy_speculation_reproduces_the_target(family, name, tmp_path):
    _, target = family(name)
    other = mlx_lm_model(dict(FAMILIES[name], num_hidden_layers=1), seed=11)
    small, _, _ = loading.load_folder(save_folder(tmp_path / "draft", dict(FAMILIES[name], num_hidden_layers=1), other),
                                      "float32")
    prompt = tokens(12, seed=3)[0].tolist()
    run = dict(params=GREEDY, max_tokens=30, stop_ids=set(), context=4096)
    plain = emitted(generate(target, prompt, **run))
    assert len(plain) == 30
    for draft in (small, padded_copy(target, VOCAB + 32)):
        events = list(generate(target, prompt, drafter=ModelDrafter(draft, "d"), k=4, **run))
        assert emitted(events) == plain
    # The padded copy of the target itself: its proposals are accepted.
    assert any(t.status is Status.ACCEPTED for e in events if isinstance(e, Step) for t in e.tokens)


# ----------------------------------------------------------------------------- what we refuse


def test_an_unsupported_rope_scaling_names_what_is_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(BASE, model_type="llama",
                                                          rope_scaling={"rope_type": "yarn", "factor": 4.0})))
    supported = "supported: default, linear, llama3, longrope"
    with pytest.raises(UnsupportedArchitecture, match=rf"^unsupported rope_scaling type 'yarn'; {supported}$"):
        loading.load_folder(tmp_path)
    with pytest.raises(MlxspecError, match="unsupported rope_scaling type 'dynamic'"):
        Llama(LlamaConfig(VOCAB, 64, 1, 4, 2, 128, rope_scaling={"type": "dynamic", "factor": 2.0}))


def test_an_unsupported_quantization_mode_names_what_is_supported(tmp_path):
    config = {**QUANT_BASE, "quantization": {"group_size": 32, "bits": 4, "mode": "fp3"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    supported = "supported: affine, mxfp4, mxfp8, nvfp4"
    with pytest.raises(MlxspecError, match=rf"quantization mode 'fp3' is not supported; {supported}$"):
        loading.load_folder(tmp_path)


def test_unimplemented_families_raise_unsupported_architecture(tmp_path):
    """What the mlx-lm fallback catches: a family we do not implement (Gemma 3 with vision)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    with pytest.raises(UnsupportedArchitecture, match=r"unsupported architecture 'gemma3'; supported: llama, mistral"):
        loading.load_folder(tmp_path)


def test_a_config_missing_what_its_family_needs_is_one_error_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    with pytest.raises(MlxspecError, match=r"^config.json of a qwen2 model: .*missing"):
        loading.load_folder(tmp_path)
