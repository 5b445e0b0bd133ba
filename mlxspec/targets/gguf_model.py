"""A llama GGUF file as our ``Llama``: llama.cpp's tensor names and metadata read into our
config, the file's structure checked first (``targets.gguf``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxspec.core.model import FREQ_FACTORS, Llama, LlamaConfig
from mlxspec.errors import MlxspecError
from mlxspec.runtime import resolve_dtype
from mlxspec.targets.gguf import check_gguf
from mlxspec.targets.tokenizer import tokenizer_from_gguf
from mlxspec.targets.weights import build_model

SUPPORTED_GGUF_ARCHS = ("llama",)

_GGUF_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_GGUF_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def _gguf_name(name: str) -> str:
    base, _, suffix = name.rpartition(".")  # suffix: weight / scales / biases
    if base in _GGUF_NAMES:
        return f"{_GGUF_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _GGUF_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK_NAMES[parts[2]]}.{suffix}"
    raise MlxspecError(f"unexpected tensor {name!r} in GGUF file")


def _meta_int(meta: dict[str, Any], key: str) -> int:
    if key not in meta:
        raise MlxspecError(f"GGUF metadata lacks {key!r}")
    return int(meta[key].item())


def config_from_gguf(meta: dict[str, Any], has_output: bool, rope_factors: list[float] | None = None) -> LlamaConfig:
    """``rope_factors``: llama.cpp's ``rope_freqs`` tensor (Llama 3.x files), one divisor of
    each rotated pair's frequency: its own form of the llama3 RoPE scaling."""
    a = meta.get("general.architecture")
    if a not in SUPPORTED_GGUF_ARCHS:
        raise MlxspecError(
            f"unsupported architecture {a!r}; supported: {', '.join(SUPPORTED_GGUF_ARCHS)}"
        )
    tokens = meta.get("tokenizer.ggml.tokens", [])
    hidden, heads = _meta_int(meta, f"{a}.embedding_length"), _meta_int(meta, f"{a}.attention.head_count")
    head_dim = _meta_int(meta, f"{a}.attention.key_length") if f"{a}.attention.key_length" in meta else None
    return LlamaConfig(
        vocab_size=int(meta[f"{a}.vocab_size"].item()) if f"{a}.vocab_size" in meta else len(tokens),
        hidden_size=hidden,
        num_layers=_meta_int(meta, f"{a}.block_count"),
        num_heads=heads,
        num_kv_heads=_meta_int(meta, f"{a}.attention.head_count_kv"),
        intermediate_size=_meta_int(meta, f"{a}.feed_forward_length"),
        rms_norm_eps=float(meta[f"{a}.attention.layer_norm_rms_epsilon"].item()),
        rope_theta=float(meta.get(f"{a}.rope.freq_base", mx.array(10000.0)).item()),
        rope_traditional=True,  # GGUF stores Q/K permuted for the interleaved rotation
        max_position=_meta_int(meta, f"{a}.context_length"),
        tie_embeddings=not has_output,
        explicit_head_dim=head_dim if head_dim != hidden // heads else None,
        rope_scaling=_gguf_rope_scaling(meta, a, rope_factors),
    )


def _gguf_rope_scaling(meta: dict[str, Any], arch: str, factors: list[float] | None) -> dict[str, Any] | None:
    if factors is not None:
        return {"rope_type": FREQ_FACTORS, "factors": factors}
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"].item())}
    raise MlxspecError(f"unsupported GGUF rope scaling type {kind!r}; supported: none, linear, rope_freqs (llama3)")


def load_gguf(path: Path, dtype: str = "auto") -> tuple[Llama, TokenizerWrapper, int]:
    check_gguf(path)  # MLX's reader would crash on some damage instead of raising
    try:
        raw, meta = mx.load(str(path), return_metadata=True)
    except Exception as err:  # mlx raises RuntimeError/ValueError with C++ messages
        raise MlxspecError(
            f"cannot read GGUF file {path}: {err} (corrupt or truncated? "
            "re-fetch registry models with `mlxspec models pull`)"
        ) from None
    factors = raw.pop("rope_freqs.weight", None)  # not a weight: the RoPE scaling, as data
    factors = None if factors is None else factors.astype(mx.float32).tolist()
    cfg = config_from_gguf(meta, has_output="output.weight" in raw, rope_factors=factors)
    tokenizer = tokenizer_from_gguf(meta)
    weights = {_gguf_name(k): v for k, v in raw.items()}
    return build_model(cfg, weights, resolve_dtype(dtype)), tokenizer, cfg.max_position
