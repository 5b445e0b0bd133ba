"""Our model written for mlx-lm: its config and weights under mlx-lm's names for the family,
as mlx-lm's own class (the reference the tests hold ours against, and the benchmarks' peer) or
as a standalone folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.rope_utils import Llama3RoPE
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxspec.core.model import FREQ_FACTORS, Llama, LlamaConfig, rope_type
from mlxspec.errors import MlxspecError
from mlxspec.targets.families import FUSED_PROJECTIONS, architecture, mlx_lm_module
from mlxspec.targets.mlxlm import MlxLmTarget
from mlxspec.targets.weights import FLOAT_DTYPES, quantize_to_match, save_safetensors

def mlx_lm_config(c: LlamaConfig) -> dict[str, Any]:
    """config.json for ``c`` as mlx-lm reads it: the keys of every family we implement (each
    family's ModelArgs takes those it knows; ``config_from_mlx_lm`` reads it back)."""
    out = {
        "model_type": c.model_type,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size,
        "rope_theta": c.rope_theta,
        "rope_traditional": c.rope_traditional,
        "rope_scaling": c.rope_scaling,
        "tie_word_embeddings": c.tie_embeddings,
        "max_position_embeddings": c.max_position,
        "attention_bias": c.qkv_bias,
        "mlp_bias": c.mlp_bias,
    }
    if c.model_type == "phi3":
        out["partial_rotary_factor"] = c.partial_rotary_factor
        if c.rope_scaling and "original_max_position_embeddings" in c.rope_scaling:
            out["original_max_position_embeddings"] = c.rope_scaling["original_max_position_embeddings"]
    if c.gemma:
        out.update(query_pre_attn_scalar=c.query_pre_attn_scalar, attn_logit_softcapping=c.attn_softcap,
                   final_logit_softcapping=c.final_softcap, sliding_window=c.sliding_window,
                   sliding_window_pattern=c.sliding_window_pattern, rope_local_base_freq=c.rope_local_theta)
    return out


def _mlx_lm_weights(model: Llama) -> dict[str, mx.array]:
    """Our parameters under mlx-lm's names for the family (Phi-3's projections fused again)."""
    params = dict(tree_flatten(model.parameters()))
    if model.cfg.model_type != "phi3":
        return params
    out = {}
    for fused, parts in FUSED_PROJECTIONS.items():
        for i in range(model.cfg.num_layers):
            head = f"model.layers.{i}."
            for suffix in ("weight", "scales", "biases", "bias"):
                pieces = [params.pop(f"{head}{p}.{suffix}") for p in parts if f"{head}{p}.{suffix}" in params]
                if pieces:
                    out[f"{head}{fused}.{suffix}"] = mx.concatenate(pieces, axis=0)
    return {**params, **out}


def _quantization_of(model: nn.Module) -> dict[str, Any] | None:
    """config.json's ``quantization`` for a model's quantized layers, one entry per layer."""
    specs = {path: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
             for path, m in model.named_modules() if hasattr(m, "scales") and hasattr(m, "bits")}
    if not specs:
        return None
    return {**next(iter(specs.values())), **specs}


def to_mlx_lm(model: Llama):
    """The same weights in mlx-lm's own class for the model's family: the reference
    implementation and the peer in benchmarks."""
    c = model.cfg
    config = mlx_lm_config(c)
    factors = rope_type(c.rope_scaling) == FREQ_FACTORS
    if factors:  # mlx-lm has no such type: built unscaled, then given our frequencies below
        config["rope_scaling"] = None
    module = mlx_lm_module(c.model_type)
    ref = module.Model(module.ModelArgs.from_dict(config))
    if factors:
        rope = Llama3RoPE(c.rope_dims, c.max_position, c.rope_traditional, c.rope_theta, {"factor": 1.0})
        rope._freqs = model.layers[0].self_attn.rope.periods
        for layer in ref.layers:
            layer.self_attn.rope = rope
    params = _mlx_lm_weights(model)
    if hasattr(ref, "sanitize"):  # as mlx-lm's loader does (Gemma 3 ties its head here)
        params = ref.sanitize(params)
    quantize_to_match(ref, params, _quantization_of(model))
    ref.load_weights(list(params.items()), strict=True)
    return ref


def export_folder(model: Llama, tokenizer: TokenizerWrapper, out: Path) -> Path:
    """Write ``model`` as a standalone mlx-lm folder (config.json, model.safetensors, tokenizer).
    A GGUF model's llama.cpp RoPE factors are written as our own ``freq_factors`` scaling,
    which this loader reads and mlx-lm does not."""
    out.mkdir(parents=True, exist_ok=True)
    config = {**mlx_lm_config(model.cfg), "eos_token_id": list(tokenizer.eos_token_ids)}
    quantization = _quantization_of(model)
    if quantization:
        config["quantization"] = quantization
    (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), _mlx_lm_weights(model))
    tokenizer._tokenizer.save_pretrained(str(out))
    return out


def _rotate_half_order(weights: dict[str, mx.array], c: LlamaConfig) -> dict[str, mx.array]:
    """A GGUF's query and key rows are ordered for RoPE on adjacent pairs (``rope_traditional``);
    transformers rotates each head's first half against its second. Row 2i of a head becomes row
    i and row 2i+1 row i + head_dim/2, which gives the same attention scores under its rotation."""
    if not c.rope_traditional:
        return weights
    if c.rope_dims != c.head_dim:
        raise MlxspecError("this model rotates part of each head on adjacent pairs, which transformers cannot express")

    def reorder(w: mx.array, heads: int) -> mx.array:
        rows = w.reshape(heads, c.head_dim // 2, 2, *w.shape[1:])
        return mx.swapaxes(rows, 1, 2).reshape(w.shape)

    out = dict(weights)
    for name, w in weights.items():
        for proj, heads in (("self_attn.q_proj.", c.num_heads), ("self_attn.k_proj.", c.num_kv_heads),
                            ("self_attn.q_norm.", 1), ("self_attn.k_norm.", 1)):
            if proj in name:
                out[name] = reorder(w, heads)
    return out


def export_hf_folder(model: Llama, tokenizer: TokenizerWrapper, out: Path, dtype: str = "float32") -> Path:
    """Write ``model`` as a Hugging Face folder that transformers and vLLM load
    (``from_pretrained``): float weights under the family's names (a quantized model's
    dequantized as our loader read them), config.json with the family's architecture, and the
    tokenizer with its chat template. ``dtype``: float32 keeps every weight as loaded."""
    if rope_type(model.cfg.rope_scaling) == FREQ_FACTORS:
        raise MlxspecError("this model's RoPE carries llama.cpp's per-frequency factors, which transformers "
                           "cannot read from config.json")
    if _quantization_of(model):
        raise MlxspecError("load the model in float precision to write it for transformers (--dtype float32)")
    out.mkdir(parents=True, exist_ok=True)
    config = {**mlx_lm_config(model.cfg), "architectures": [architecture(model.cfg.model_type)], "torch_dtype": dtype,
              "eos_token_id": list(tokenizer.eos_token_ids)}
    if tokenizer.bos_token_id is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
    if model.cfg.rope_traditional:
        config["rope_traditional"] = False
    weights = _rotate_half_order(_mlx_lm_weights(model), model.cfg)
    save_safetensors(out / "model.safetensors", {k: v.astype(FLOAT_DTYPES[dtype]) for k, v in weights.items()})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer._tokenizer.save_pretrained(str(out))
    return out


def as_mlx_lm(model) -> nn.Module:
    """``model`` in mlx-lm's own class, for the benchmarks' mlx-lm peer: the module an
    ``MlxLmTarget`` wraps, or our model's weights copied into mlx-lm's class of its family."""
    return model.module if isinstance(model, MlxLmTarget) else to_mlx_lm(model)
