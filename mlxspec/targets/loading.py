"""The only module that knows model file formats.

``load(spec)`` accepts a registry name (``default`` for the embedded target), a ``.gguf`` file,
or an mlx-lm / Hugging Face model folder, and returns a ``LoadedModel``: our ``Llama`` with the
weights in the per-device format, the tokenizer, and what we know about it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.errors import MlxspecError
from mlxspec.runtime import resolve_dtype
from mlxspec.targets import store
from mlxspec.targets.tokenizer import tokenizer_from_gguf

SUPPORTED_GGUF_ARCHS = ("llama",)
SUPPORTED_MLX_LM_TYPES = ("llama", "mistral")

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
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: TokenizerWrapper
    name: str
    path: Path
    dtype: str
    context_length: int

    @property
    def config(self) -> LlamaConfig:
        return self.model.cfg

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decoded token reads: everything but the unused embedding rows
        (with tied embeddings the whole matrix is read once, as the LM head)."""
        params = dict(tree_flatten(self.model.parameters()))
        total = sum(v.nbytes for v in params.values())
        if not self.config.tie_embeddings:
            total -= sum(v.nbytes for k, v in params.items() if k.startswith("model.embed_tokens"))
        return total


def _gguf_name(name: str) -> str:
    base, _, suffix = name.rpartition(".")  # suffix: weight / scales / biases
    if base in _GGUF_NAMES:
        return f"{_GGUF_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _GGUF_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK_NAMES[parts[2]]}.{suffix}"
    raise MlxspecError(f"unexpected tensor {name!r} in GGUF file")


def _bits(w: mx.array, scales: mx.array, group_size: int = 32) -> int:
    return w.shape[-1] * 32 // (scales.shape[-1] * group_size)


def _meta_int(meta: dict[str, Any], key: str) -> int:
    if key not in meta:
        raise MlxspecError(f"GGUF metadata lacks {key!r}")
    return int(meta[key].item())


def config_from_gguf(meta: dict[str, Any], has_output: bool) -> LlamaConfig:
    a = meta.get("general.architecture")
    if a not in SUPPORTED_GGUF_ARCHS:
        raise MlxspecError(
            f"unsupported architecture {a!r}; supported: {', '.join(SUPPORTED_GGUF_ARCHS)}"
        )
    tokens = meta.get("tokenizer.ggml.tokens", [])
    return LlamaConfig(
        vocab_size=int(meta[f"{a}.vocab_size"].item()) if f"{a}.vocab_size" in meta else len(tokens),
        hidden_size=_meta_int(meta, f"{a}.embedding_length"),
        num_layers=_meta_int(meta, f"{a}.block_count"),
        num_heads=_meta_int(meta, f"{a}.attention.head_count"),
        num_kv_heads=_meta_int(meta, f"{a}.attention.head_count_kv"),
        intermediate_size=_meta_int(meta, f"{a}.feed_forward_length"),
        rms_norm_eps=float(meta[f"{a}.attention.layer_norm_rms_epsilon"].item()),
        rope_theta=float(meta.get(f"{a}.rope.freq_base", mx.array(10000.0)).item()),
        rope_traditional=True,  # GGUF stores Q/K permuted for the interleaved rotation
        max_position=_meta_int(meta, f"{a}.context_length"),
        tie_embeddings=not has_output,
    )


def quantize_to_match(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Swap in quantized layers wherever ``weights`` holds a quantized triple, bits per tensor
    (the GGUF keeps 8-bit embeddings next to 4-bit blocks)."""
    def predicate(path: str, module: nn.Module):
        if f"{path}.scales" not in weights:
            return False
        return {"group_size": 32, "bits": _bits(weights[f"{path}.weight"], weights[f"{path}.scales"])}

    nn.quantize(model, class_predicate=predicate)


def _build(cfg: LlamaConfig, weights: dict[str, mx.array], dtype: str) -> Llama:
    """Instantiate ``Llama`` with weights that may be quantized (weight/scales/biases triples)."""
    model = Llama(cfg)
    quantized = {k[: -len(".scales")] for k in weights if k.endswith(".scales")}
    if dtype == "quantized":
        quantize_to_match(model, weights)
    else:
        target = _DTYPES[dtype]
        dense = {}
        for k, v in weights.items():
            base = k.rsplit(".", 1)[0]
            if base in quantized:
                if k.endswith(".weight"):
                    s, b = weights[f"{base}.scales"], weights[f"{base}.biases"]
                    dense[k] = mx.dequantize(v, s, b, group_size=32, bits=_bits(v, s)).astype(target)
            else:
                dense[k] = v.astype(target)
        weights = dense
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as err:
        raise MlxspecError(f"weights do not fit a llama model: {err}") from None
    mx.eval(model.parameters())
    return model


def load_gguf(path: Path, dtype: str = "auto") -> tuple[Llama, TokenizerWrapper, int]:
    try:
        raw, meta = mx.load(str(path), return_metadata=True)
    except Exception as err:  # mlx raises RuntimeError/ValueError with C++ messages
        raise MlxspecError(
            f"cannot read GGUF file {path}: {err} (corrupt or truncated? "
            "re-fetch registry models with `mlxspec models pull`)"
        ) from None
    cfg = config_from_gguf(meta, has_output="output.weight" in raw)
    tokenizer = tokenizer_from_gguf(meta)
    weights = {_gguf_name(k): v for k, v in raw.items()}
    return _build(cfg, weights, resolve_dtype(dtype)), tokenizer, cfg.max_position


def config_from_mlx_lm(cfg: dict[str, Any]) -> LlamaConfig:
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MLX_LM_TYPES:
        raise MlxspecError(
            f"unsupported architecture {mt!r}; supported: {', '.join(SUPPORTED_MLX_LM_TYPES)}"
        )
    heads = cfg["num_attention_heads"]
    return LlamaConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=cfg.get("rope_theta", 10000.0),
        rope_traditional=cfg.get("rope_traditional", False),
        max_position=cfg.get("max_position_embeddings", 4096),
        tie_embeddings=cfg.get("tie_word_embeddings", True),
    )


def load_folder(path: Path, dtype: str = "auto") -> tuple[Llama, TokenizerWrapper, int]:
    """An mlx-lm / Hugging Face folder (config.json, *.safetensors, tokenizer files)."""
    from mlx_lm.utils import load_tokenizer

    cfg_dict = json.loads((path / "config.json").read_text())
    cfg = config_from_mlx_lm(cfg_dict)
    weights: dict[str, mx.array] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    if not weights:
        raise MlxspecError(f"{path} has no *.safetensors weights")
    weights = {k: v for k, v in weights.items() if "rotary_emb" not in k}
    q = cfg_dict.get("quantization")
    if q and q.get("group_size", 32) != 32:
        raise MlxspecError(f"{path}: only group size 32 quantization is supported here")
    tokenizer = load_tokenizer(path, eos_token_ids=cfg_dict.get("eos_token_id"))
    return _build(cfg, weights, resolve_dtype(dtype)), tokenizer, cfg.max_position


def resolve(spec: str) -> tuple[str, Path]:
    """A user's model spec -> (display name, local path). No network."""
    if spec in ("default", ""):
        spec = store.default_target()
    e = store.entry(spec)
    if e is not None:
        if not e.present:
            raise MlxspecError(f"model {e.name!r} is not downloaded; run `mlxspec models pull {e.name}`")
        return e.name, e.path
    p = Path(spec).expanduser()
    if p.is_file() or (p.is_dir() and (p / "config.json").is_file()):
        return p.stem if p.is_file() else p.name, p
    if p.is_dir():
        raise MlxspecError(f"{p} is a folder without config.json (not an mlx-lm / HF model)")
    if store.is_hub_id(spec):
        snapshot = store.hub_snapshot(spec)
        if snapshot is None:
            raise MlxspecError(f"{spec} is not in the hub cache; download it once with `mlxspec models pull {spec}`")
        if not (snapshot / "config.json").is_file():
            raise MlxspecError(f"{spec}: the cached snapshot {snapshot} has no config.json (not an mlx-lm / HF model)")
        return spec, snapshot
    raise MlxspecError(
        f"model {spec!r} not found: not a registry name ({', '.join(x.name for x in store.entries())}), "
        "a .gguf file, a model folder or a hub id (org/name) in the hub cache"
    )


def load(spec: str = "default", dtype: str = "auto") -> LoadedModel:
    dtype = resolve_dtype(dtype)
    name, path = resolve(spec)
    if path.is_dir():
        model, tok, ctx = load_folder(path, dtype)
    elif path.suffix == ".gguf" or path.read_bytes()[:4] == b"GGUF":
        model, tok, ctx = load_gguf(path, dtype)
    else:
        raise MlxspecError(f"{path}: unknown model format (expected .gguf or an mlx-lm folder)")
    return LoadedModel(model, tok, name, path, dtype, ctx)


def to_mlx_lm(model: Llama):
    """The same weights in mlx-lm's own llama class: the reference implementation and the
    peer in benchmarks."""
    from mlx_lm.models import llama

    c = model.cfg
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        intermediate_size=c.intermediate_size,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        rms_norm_eps=c.rms_norm_eps,
        vocab_size=c.vocab_size,
        rope_theta=c.rope_theta,
        rope_traditional=c.rope_traditional,
        tie_word_embeddings=c.tie_embeddings,
        max_position_embeddings=c.max_position,
        head_dim=c.head_dim,
    )
    ref = llama.Model(args)
    params = dict(tree_flatten(model.parameters()))
    quantize_to_match(ref, params)
    ref.load_weights(list(params.items()), strict=True)
    return ref


def export_folder(model: Llama, tokenizer: TokenizerWrapper, out: Path) -> Path:
    """Write ``model`` as a standalone mlx-lm folder (config.json, model.safetensors, tokenizer)."""
    c = model.cfg
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size,
        "rope_theta": c.rope_theta,
        "rope_traditional": c.rope_traditional,
        "tie_word_embeddings": c.tie_embeddings,
        "max_position_embeddings": c.max_position,
        "eos_token_id": list(tokenizer.eos_token_ids),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    tokenizer._tokenizer.save_pretrained(str(out))
    return out


def check_compatible(target: TokenizerWrapper, draft: TokenizerWrapper) -> None:
    """Same tokenizer content (not the same embedding size: mlx-community pairs pad their
    tables differently). Fails naming the first token id where they differ."""
    tv, dv = target._tokenizer.get_vocab(), draft._tokenizer.get_vocab()
    if tv == dv:
        return
    t_by_id = {i: t for t, i in tv.items()}
    d_by_id = {i: t for t, i in dv.items()}
    for i in sorted(set(t_by_id) | set(d_by_id)):
        if t_by_id.get(i) != d_by_id.get(i):
            raise MlxspecError(
                f"draft and target tokenizers differ at id {i}: target {t_by_id.get(i)!r}, "
                f"draft {d_by_id.get(i)!r} ({len(tv)} vs {len(dv)} tokens)"
            )
