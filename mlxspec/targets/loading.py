"""The only module that knows model file formats.

``load(spec)`` accepts a registry name (``default`` for the embedded target), a ``.gguf`` file,
or an mlx-lm / Hugging Face model folder, and returns a ``LoadedModel``: our ``Llama`` with the
weights in the per-device format, the tokenizer, and what we know about it.
"""

from __future__ import annotations

import importlib
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.rope_utils import Llama3RoPE
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from mlxspec.core.model import FREQ_FACTORS, NATIVE_FAMILIES, Llama, LlamaConfig, check_rope_scaling, rope_type
from mlxspec.errors import MlxspecError, UnsupportedArchitecture
from mlxspec.runtime import resolve_dtype
from mlxspec.targets.gguf import check_gguf
from mlxspec.targets import mlxlm, store
from mlxspec.targets.mlxlm import MlxLmTarget
from mlxspec.targets.tokenizer import tokenizer_from_gguf
from mlxspec.torchpath import prefer_torch, require_torch, split_backend, torch_may_run

SUPPORTED_GGUF_ARCHS = ("llama",)
SUPPORTED_MLX_LM_TYPES = NATIVE_FAMILIES
QUANT_MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")  # what mx.dequantize and nn.quantize take
_MICROSCALED = {(4, 32): "mxfp4", (8, 32): "mxfp8", (4, 16): "nvfp4"}  # (bits, group size): mode

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
    backend: str = "mlx"  # or "torch:<device>" (``torchpath.load``)
    source: LoadedModel | None = None  # on torch: the MLX model the weights were copied from

    @property
    def config(self) -> LlamaConfig:
        return self.model.cfg

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decoded token reads: everything but the unused embedding rows
        (with tied embeddings the whole matrix is read once, as the LM head)."""
        if self.backend != "mlx":
            sizes = {k: v.numel() * v.element_size() for k, v in self.model.named_parameters()}
            # the file's 4-bit layers (torchpath.int4) hold no parameters: what their kernel reads
            sizes |= {name: m.kernel_bytes for name, m in self.model.named_modules() if hasattr(m, "kernel_bytes")}
        else:
            sizes = {k: v.nbytes for k, v in tree_flatten(self.model.parameters())}
        total = sum(sizes.values())
        if not self.config.tie_embeddings:
            total -= sum(n for k, n in sizes.items() if k.startswith("model.embed_tokens"))
        return total


def _gguf_name(name: str) -> str:
    base, _, suffix = name.rpartition(".")  # suffix: weight / scales / biases
    if base in _GGUF_NAMES:
        return f"{_GGUF_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _GGUF_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK_NAMES[parts[2]]}.{suffix}"
    raise MlxspecError(f"unexpected tensor {name!r} in GGUF file")


def _quant_spec(path: str, weights: dict[str, mx.array], in_dims: int,
                quantization: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """How the module at ``path`` was quantized (group size, bits, mode), None if it was not.

    As mlx-lm 0.32 reads it: a per-module entry in config.json's ``quantization`` wins;
    otherwise the shapes say (group size = inputs / scale columns, bits = packed width * 32 /
    inputs) and the scales' dtype the mode (only affine keeps float scales; each microscaled
    mode allows one group size and width). GGUF files carry no config: their shapes say 32."""
    if f"{path}.scales" not in weights:
        return None
    if f"{path}.global_scale" in weights:
        raise MlxspecError(f"{path}: quantization with global scales is not supported; supported modes: "
                           f"{', '.join(QUANT_MODES)} without them")
    entry = (quantization or {}).get(path)
    if isinstance(entry, dict):
        spec = {k: entry.get(k, quantization.get(k)) for k in ("group_size", "bits", "mode")}
        spec["mode"] = spec["mode"] or "affine"
    else:
        scales = weights[f"{path}.scales"]
        spec = {"group_size": in_dims // scales.shape[-1], "bits": weights[f"{path}.weight"].shape[-1] * 32 // in_dims}
        if scales.dtype != mx.uint8:
            spec["mode"] = "affine"
        else:
            spec["mode"] = _MICROSCALED.get((spec["bits"], spec["group_size"]))
            if spec["mode"] is None:
                raise MlxspecError(f"{path}: cannot tell the quantization mode of {spec['bits']}-bit weights in groups "
                                   f"of {spec['group_size']} with 8-bit scales; supported: {', '.join(QUANT_MODES)}")
    _check_mode(spec["mode"], path)
    return spec


def _check_mode(mode: str, where: str) -> None:
    if mode not in QUANT_MODES:
        raise MlxspecError(f"{where}: quantization mode {mode!r} is not supported; supported: {', '.join(QUANT_MODES)}")


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


def quantize_to_match(model: nn.Module, weights: dict[str, mx.array],
                      quantization: dict[str, Any] | None = None) -> None:
    """Swap in quantized layers wherever ``weights`` holds a quantized set (weight, scales and
    biases where the mode has them), each with its own group size, bits and mode (the GGUF
    keeps 8-bit embeddings next to 4-bit blocks; mlx-lm folders may name per-module settings
    in config.json's ``quantization``)."""
    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized"):
            return False
        return _quant_spec(path, weights, module.weight.shape[-1], quantization) or False

    nn.quantize(model, class_predicate=predicate)


def _dequantized(weights: dict[str, mx.array], shapes: dict[str, tuple[int, ...]], dtype: mx.Dtype,
                 quantization: dict[str, Any] | None) -> dict[str, mx.array]:
    """Every quantized set in ``weights`` as one float ``weight`` of ``dtype``, the rest cast.
    ``shapes``: the model's own parameter shapes (a quantized tensor does not say its width)."""
    quantized = {k[: -len(".scales")] for k in weights if k.endswith(".scales")}
    dense = {}
    for base in sorted(quantized):
        if f"{base}.weight" not in shapes:
            raise MlxspecError(f"weights do not fit the model: quantized {base!r} is not one of its layers")
        spec = _quant_spec(base, weights, shapes[f"{base}.weight"][-1], quantization)
        w = mx.dequantize(weights[f"{base}.weight"], weights[f"{base}.scales"], weights.get(f"{base}.biases"), **spec)
        dense[f"{base}.weight"] = w.astype(dtype)
    for k, v in weights.items():
        base, _, suffix = k.rpartition(".")
        if base not in quantized or suffix not in ("weight", "scales", "biases"):  # else folded in above
            dense[k] = v.astype(dtype)
    return dense


def _build(cfg: LlamaConfig, weights: dict[str, mx.array], dtype: str,
           quantization: dict[str, Any] | None = None) -> Llama:
    """Instantiate ``Llama`` with weights that may be quantized: kept so with dtype
    "quantized", else dequantized to ``dtype`` with each layer's own settings."""
    model = Llama(cfg)
    if dtype == "quantized":
        quantize_to_match(model, weights, quantization)
    else:
        shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
        weights = _dequantized(weights, shapes, _DTYPES[dtype], quantization)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as err:
        raise MlxspecError(f"weights do not fit a {cfg.model_type} model: {err}") from None
    mx.eval(model.parameters())
    return model


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
    return _build(cfg, weights, resolve_dtype(dtype)), tokenizer, cfg.max_position


def _mlx_lm_args(cfg: dict[str, Any]) -> Any:
    """mlx-lm's own ``ModelArgs`` for ``cfg``: its defaults and its checks, so that our module
    reads config.json exactly as mlx-lm's class for the family would."""
    cfg = _lift_rope_parameters(cfg)
    mt = cfg["model_type"]
    if mt == "phi3" and cfg.get("rope_scaling"):
        # mlx-lm's phi3 drops other scaling types with a printed warning: wrong logits, not ours.
        kind = rope_type(cfg["rope_scaling"])
        if kind not in ("longrope", "su", "linear"):
            raise UnsupportedArchitecture(
                f"unsupported rope_scaling type {kind!r} for phi3; supported: linear, longrope, su")
    module = importlib.import_module(f"mlx_lm.models.{_MLX_LM_MODULES.get(mt, mt)}")
    try:
        return module.ModelArgs.from_dict(cfg)
    except Exception as err:  # TypeError/ValueError, or huggingface-hub's strict-dataclass errors
        raise MlxspecError(f"config.json of a {mt} model: {err}") from None


def _lift_rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
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


_FAMILIES = {"llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "phi3": _phi3,
             "gemma2": _gemma2, "gemma3_text": _gemma3_text}
_MLX_LM_MODULES = {"mistral": "llama"}  # as mlx-lm's MODEL_REMAPPING
# Phi-3's fused projections, split at load time into the separate ones our blocks have.
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def config_from_mlx_lm(cfg: dict[str, Any]) -> LlamaConfig:
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MLX_LM_TYPES:
        raise UnsupportedArchitecture(
            f"unsupported architecture {mt!r}; supported: {', '.join(SUPPORTED_MLX_LM_TYPES)}"
        )
    return _FAMILIES[mt](_mlx_lm_args(cfg), cfg)


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
        if fused not in _FUSED:
            out[k] = v
            continue
        head = f"{prefix}.layers.{layer}."
        cuts = list(itertools.accumulate(_fused_sizes(cfg, fused)))[:-1]
        for name, part in zip(_FUSED[fused], mx.split(v, cuts, axis=0)):
            out[f"{head}{name}.{suffix}"] = part
            if quant and base in quant:
                quant[f"{head}{name}"] = quant[base]
    return out, quant


def _quantization(cfg_dict: dict[str, Any], path: Path) -> dict[str, Any] | None:
    q = cfg_dict.get("quantization")
    if q is not None:
        _check_mode(q.get("mode", "affine"), str(path))
    return q


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict, or one ``MlxspecError`` saying what is wrong with it."""
    path = Path(folder) / "config.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise MlxspecError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:  # not UTF-8, or not JSON
        raise MlxspecError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MlxspecError(f"{path} holds a JSON {type(obj).__name__}, not an object")
    return obj


def load_folder(path: Path, dtype: str = "auto") -> tuple[Llama, TokenizerWrapper, int]:
    """An mlx-lm / Hugging Face folder (config.json, *.safetensors, tokenizer files).
    Raises ``UnsupportedArchitecture`` for a model type (or RoPE scaling) we do not implement."""
    cfg_dict = read_config(path)
    cfg = config_from_mlx_lm(cfg_dict)
    quantization = _quantization(cfg_dict, path)
    weights: dict[str, mx.array] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    if not weights:
        raise MlxspecError(f"{path} has no *.safetensors weights")
    cfg = _settle_tied(cfg, weights)
    weights = _sanitize(weights, cfg)
    if cfg.model_type == "phi3":
        weights, quantization = _split_fused(weights, quantization, cfg)
    tokenizer = load_tokenizer(path, eos_token_ids=cfg_dict.get("eos_token_id"))
    return _build(cfg, weights, resolve_dtype(dtype), quantization), tokenizer, cfg.max_position


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


def as_loaded(model: Any, dtype: str = "auto") -> Any:
    """``model`` loaded: a spec (a string) is loaded, anything else is taken as a model already
    loaded (a ``LoadedModel``, or a test double with its model and tokenizer)."""
    return load(model, dtype) if isinstance(model, str) else model


def load(spec: str = "default", dtype: str = "auto", backend: str = "mlx") -> LoadedModel:
    """A target or draft model by ``spec``, on ``backend``: "mlx", "torch" / "torch:DEVICE"
    (the same weights copied into torch's llama module; ``torchpath.load``), or "auto"
    (``torchpath.prefer_torch``: torch on a Linux CPU where it is installed, else MLX)."""
    if backend == "auto":
        # where torch will run it (a Linux CPU), read the file's quantized layers as stored: the
        # torch target runs them on its int4 kernel (torchpath.int4), MLX's CPU backend would not
        guess = "quantized" if dtype == "auto" and torch_may_run() else dtype
        source = load(spec, guess)
        if source.dtype not in ("float32", "quantized") or not prefer_torch(source.model, dtype):
            return source if guess == dtype else load(spec, dtype)
        from mlxspec.torchpath.load import to_torch

        return to_torch(source, guess, "cpu")
    if backend != "mlx":
        require_torch()
        from mlxspec.torchpath import pick_device
        from mlxspec.torchpath.load import to_torch, torch_dtype  # imports torch, an optional extra

        device = pick_device(split_backend(backend))
        dtype = torch_dtype(dtype, device)
        return to_torch(load(spec, "quantized" if dtype == "quantized" else "float32"), dtype, device)
    dtype = resolve_dtype(dtype)
    name, path = resolve(spec)
    if path.is_dir():
        try:
            model, tok, ctx = load_folder(path, dtype)
        except UnsupportedArchitecture:
            # Not a family we implement: mlx-lm's own class, if it has one, behind the target seam.
            model, tok, ctx = mlxlm.load_folder(path, dtype)
    elif path.suffix == ".gguf" or path.read_bytes()[:4] == b"GGUF":
        model, tok, ctx = load_gguf(path, dtype)
    else:
        raise MlxspecError(f"{path}: unknown model format (expected .gguf or an mlx-lm folder)")
    return LoadedModel(model, tok, name, path, dtype, ctx)


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
    for fused, parts in _FUSED.items():
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
    module = importlib.import_module(f"mlx_lm.models.{_MLX_LM_MODULES.get(c.model_type, c.model_type)}")
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


def as_mlx_lm(model) -> nn.Module:
    """``model`` in mlx-lm's own class, for the benchmarks' mlx-lm peer: the module an
    ``MlxLmTarget`` wraps, or our model's weights copied into mlx-lm's class of its family."""
    return model.module if isinstance(model, MlxLmTarget) else to_mlx_lm(model)
