"""Checkpoint weights into our ``Llama``: each layer's quantization read as mlx-lm reads it, kept
quantized or dequantized to the dtype asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.errors import MlxspecError

# The float dtypes a checkpoint is written in, by the names config.json and our flags use.
FLOAT_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
QUANT_MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")  # what mx.dequantize and nn.quantize take
_MICROSCALED = {(4, 32): "mxfp4", (8, 32): "mxfp8", (4, 16): "nvfp4"}  # (bits, group size): mode
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


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
    check_mode(spec["mode"], path)
    return spec


def check_mode(mode: str, where: str) -> None:
    if mode not in QUANT_MODES:
        raise MlxspecError(f"{where}: quantization mode {mode!r} is not supported; supported: {', '.join(QUANT_MODES)}")


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


def build_model(cfg: LlamaConfig, weights: dict[str, mx.array], dtype: str,
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


def save_safetensors(path: Path, weights: dict[str, mx.array], fmt: str = "pt") -> Path:
    """``weights`` written to ``path`` through a file beside it, renamed once complete: a reader
    never sees half a file."""
    tmp = path.with_name(path.name + ".partial.safetensors")
    mx.save_safetensors(str(tmp), weights, metadata={"format": fmt})
    tmp.replace(path)
    return path
