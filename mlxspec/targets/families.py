"""The model families our decoder implements, listed once (``FAMILIES``): each reads a
config.json through mlx-lm's own ``ModelArgs`` for the family into our ``LlamaConfig``, and
says how its checkpoints' weights map onto our blocks."""

from __future__ import annotations

import importlib
import itertools
from dataclasses import replace
from typing import Any

import mlx.core as mx

from mlxspec.core.model import LlamaConfig, check_rope_scaling, rope_type
from mlxspec.errors import MlxspecError, UnsupportedArchitecture

def _mlx_lm_args(cfg: dict[str, Any]) -> Any:
    """mlx-lm's own ``ModelArgs`` for ``cfg``: its defaults and its checks, so that our module
    reads config.json exactly as mlx-lm's class for the family would."""
    cfg = lift_rope_parameters(cfg)
    mt = cfg["model_type"]
    if mt == "phi3" and cfg.get("rope_scaling"):
        # mlx-lm's phi3 drops other scaling types with a printed warning: wrong logits, not ours.
        kind = rope_type(cfg["rope_scaling"])
        if kind not in ("longrope", "su", "linear"):
            raise UnsupportedArchitecture(
                f"unsupported rope_scaling type {kind!r} for phi3; supported: linear, longrope, su")
    module = mlx_lm_module(mt)
    try:
        return module.ModelArgs.from_dict(cfg)
    except Exception as err:  # TypeError/ValueError, or huggingface-hub's strict-dataclass errors
        raise MlxspecError(f"config.json of a {mt} model: {err}") from None


def lift_rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers >= 5 writes rope_theta and the scaling inside ``rope_parameters``. mlx-lm's
    qwen3 looks there, its llama does not (it would run base 10000, unscaled): lift them out."""
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, dict):
        return cfg
    out = dict(cfg)
    if "rope_theta" not in out and "rope_theta" in rp:
        out["rope_theta"] = rp["rope_theta"]
    if not out.get("rope_scaling") and rope_type(rp) != "default":
        out["rope_scaling"] = rp
    return out


def _base_config(a: Any, cfg: dict[str, Any], **family: Any) -> LlamaConfig:
    """What every family shares, read off mlx-lm's ``ModelArgs`` ``a`` (``cfg``: config.json,
    for what a family's ModelArgs does not keep)."""
    check_rope_scaling(getattr(a, "rope_scaling", None))
    heads = a.num_attention_heads
    family.setdefault("tie_embeddings", getattr(a, "tie_word_embeddings", cfg.get("tie_word_embeddings", True)))
    return LlamaConfig(
        vocab_size=a.vocab_size,
        hidden_size=a.hidden_size,
        num_layers=a.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=a.num_key_value_heads or heads,
        intermediate_size=a.intermediate_size,
        rms_norm_eps=a.rms_norm_eps,
        rope_theta=a.rope_theta,
        rope_traditional=getattr(a, "rope_traditional", False),
        max_position=getattr(a, "max_position_embeddings", None) or cfg.get("max_position_embeddings") or 4096,
        model_type=cfg["model_type"],
        **family,
    )


def _llama(a: Any, cfg: dict[str, Any]) -> LlamaConfig:
    if "sliding_attention" in (a.layer_types or []):
        raise UnsupportedArchitecture(f"{cfg['model_type']} with sliding-window layers is not implemented here")
    return _base_config(a, cfg, explicit_head_dim=a.head_dim, qkv_bias=a.attention_bias, o_bias=a.attention_bias,
                        mlp_bias=a.mlp_bias, rope_scaling=a.rope_scaling)


def _qwen2(a: Any, cfg: dict[str, Any]) -> LlamaConfig:
    return _base_config(a, cfg, qkv_bias=True, rope_scaling=a.rope_scaling)


def _qwen3(a: Any, cfg: dict[str, Any]) -> LlamaConfig:
    return _base_config(a, cfg, explicit_head_dim=a.head_dim, qk_norm=True, rope_scaling=a.rope_scaling)


def _phi3(a: Any, cfg: dict[str, Any]) -> LlamaConfig:
    scaling = a.rope_scaling
    if rope_type(scaling) in ("longrope", "su"):  # phi3 keeps this one outside rope_scaling
        scaling = {**scaling, "original_max_position_embeddings": a.original_max_position_embeddings}
    return _base_config(a, cfg, rope_scaling=scaling, partial_rotary_factor=a.partial_rotary_factor)


def _gemma2(a: Any, cfg: dict[str, Any]) -> LlamaConfig:
    # mlx-lm's gemma2 attends over the whole context in every layer (no sliding window): so do we.
    return _base_config(a, cfg, explicit_head_dim=a.head_dim, gemma=True, embed_scale=a.hidden_size**0.5,
                        query_pre_attn_scalar=a.query_pre_attn_scalar, attn_softcap=a.attn_logit_softcapping,
                        final_softcap=a.final_logit_softcapping, tie_embeddings=True)


def _gemma3_text(a: Any, cfg: dict[str, Any]) -> LlamaConfig:
    # mlx-lm rounds the embedding scale to bfloat16; tied or not is settled by the weights
    # (``_settle_tied``).
    scale = mx.array(a.hidden_size**0.5, mx.bfloat16).astype(mx.float32).item()
    return _base_config(a, cfg, explicit_head_dim=a.head_dim, gemma=True, qk_norm=True, embed_scale=scale,
                        query_pre_attn_scalar=a.query_pre_attn_scalar, sliding_window=a.sliding_window,
                        sliding_window_pattern=a.sliding_window_pattern, rope_local_theta=a.rope_local_base_freq,
                        rope_scaling=a.rope_scaling)


FAMILIES = {"llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "phi3": _phi3,
             "gemma2": _gemma2, "gemma3_text": _gemma3_text}
MLX_LM_MODULES = {"mistral": "llama"}  # as mlx-lm's MODEL_REMAPPING
# Phi-3's fused projections, split at load time into the separate ones our blocks have.
FUSED_PROJECTIONS = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def architecture(model_type: str) -> str:
    """The class name transformers (and so vLLM) gives a family's checkpoints in config.json."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]


def mlx_lm_module(model_type: str) -> Any:
    """mlx-lm's module for a family (its ``Model`` and ``ModelArgs``)."""
    return importlib.import_module(f"mlx_lm.models.{MLX_LM_MODULES.get(model_type, model_type)}")


def config_from_mlx_lm(cfg: dict[str, Any]) -> LlamaConfig:
    mt = cfg.get("model_type")
    if mt not in FAMILIES:
        raise UnsupportedArchitecture(
            f"unsupported architecture {mt!r}; supported: {', '.join(FAMILIES)}"
        )
    return FAMILIES[mt](_mlx_lm_args(cfg), cfg)


def _settle_tied(cfg: LlamaConfig, weights: dict[str, mx.array]) -> LlamaConfig:
    """Gemma 3's config does not say whether the head is tied: mlx-lm ties it when the
    checkpoint has no ``lm_head``."""
    if cfg.model_type == "gemma3_text":
        return replace(cfg, tie_embeddings="lm_head.weight" not in weights)
    return cfg


def _sanitize(weights: dict[str, mx.array], cfg: LlamaConfig) -> dict[str, mx.array]:
    """mlx-lm's ``sanitize`` rules: no precomputed RoPE tables, and no separate head in a tied
    model (some tied checkpoints still carry a copy of the embeddings as ``lm_head``)."""
    out = {k: v for k, v in weights.items() if "rotary_emb" not in k}
    if cfg.tie_embeddings:
        out = {k: v for k, v in out.items() if not k.startswith("lm_head.")}
    return out


def _fused_sizes(cfg: LlamaConfig, fused: str) -> list[int]:
    if fused == "mlp.gate_up_proj":
        return [cfg.intermediate_size] * 2
    return [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2


def _split_fused(weights: dict[str, mx.array], quantization: dict[str, Any] | None,
                 cfg: LlamaConfig) -> tuple[dict[str, mx.array], dict[str, Any] | None]:
    """Phi-3's ``qkv_proj`` / ``gate_up_proj`` as separate projections. Output rows split
    cleanly, quantized or not (quantization groups run along the input), and per-module
    quantization entries follow the rows to their new names."""
    out, quant = {}, dict(quantization) if quantization else quantization
    for k, v in weights.items():
        base, _, suffix = k.rpartition(".")
        prefix, _, fused = base.partition(".layers.")
        layer, _, fused = fused.partition(".")
        if fused not in FUSED_PROJECTIONS:
            out[k] = v
            continue
        head = f"{prefix}.layers.{layer}."
        cuts = list(itertools.accumulate(_fused_sizes(cfg, fused)))[:-1]
        for name, part in zip(FUSED_PROJECTIONS[fused], mx.split(v, cuts, axis=0)):
            out[f"{head}{name}.{suffix}"] = part
            if quant and base in quant:
                quant[f"{head}{name}"] = quant[base]
    return out, quant


def prepare_weights(cfg: LlamaConfig, weights: dict[str, mx.array], quantization: dict[str, Any] | None
                    ) -> tuple[LlamaConfig, dict[str, mx.array], dict[str, Any] | None]:
    """A checkpoint's weights as our blocks take them, by the family's rules (the config settled
    by the weights where the family leaves it open)."""
    cfg = _settle_tied(cfg, weights)
    weights = _sanitize(weights, cfg)
    if cfg.model_type == "phi3":
        weights, quantization = _split_fused(weights, quantization, cfg)
    return cfg, weights, quantization
