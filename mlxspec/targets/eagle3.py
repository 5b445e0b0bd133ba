"""Published EAGLE-3 head folders, read and written: the layouts of SafeAILab's EAGLE and
SpecForge (a llama-style ``config.json`` with architecture ``LlamaForCausalLMEagle3``, weights
``midlayer.*``) and of vLLM's ``speculators`` (``speculators_model_type: eagle3``, the layer's
config under ``transformer_layer_config``, weights ``layers.0.*``), in ``model.safetensors`` or
``pytorch_model.bin`` (read only through ``torch.load(weights_only=True)``: no pickled code runs).

What a config means, as vLLM and SGLang read it (their code is the definition these follow):
- ``eagle_aux_hidden_state_layer_ids`` at the top level: block indices whose *input* the target
  hands over (vLLM); under ``eagle_config`` (SpecForge, read by SGLang): the *output* of those
  blocks when the first id is 1 (SGLang adds one then), block inputs otherwise; none named:
  blocks 2, L/2 and L-3.
- ``d2t[c]``: the offset of draft column c to its target token; ``t2d`` is its mask over the
  target vocabulary (derived, so not read). No ``d2t``: the draft vocabulary is the target's.
- ``embed_tokens.weight`` absent: the head shares the target's embedding table.

A head written here uses the SafeAILab/SpecForge layout with the ids at the top level, equal to
the default blocks, so vLLM and SGLang tap the same blocks whichever way they read them; or, asked
for, the speculators layout, which speculators itself loads (``SpeculatorModel.from_pretrained``)
as well as vLLM, the ids at the top level where that layout keeps them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxspec.core.drafters.eagle3 import (
    Eagle3Config,
    Eagle3Head,
    d2t_from_ids,
    default_aux_layers,
    ids_from_d2t,
    t2d_from_ids,
)
from mlxspec.core.model import rope_type
from mlxspec.errors import MlxspecError
from mlxspec.targets import store
from mlxspec.targets.families import architecture, lift_rope_parameters
from mlxspec.targets.folders import tokenizer_fingerprint
from mlxspec.targets.loading import read_config
from mlxspec.targets.weights import FLOAT_DTYPES, save_safetensors

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator")
WRITTEN_ARCHITECTURE = "LlamaForCausalLMEagle3"  # the name both vLLM's and SGLang's registries know
LAYOUTS = ("specforge", "speculators")  # what save_eagle3 writes: SafeAILab/SpecForge's, vLLM speculators'
# The proposal speculators records when it converts a head (its default: a chain of 3, greedy).
SPECULATORS_PROPOSAL = {"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0,
                        "verifier_accept_k": 1}
SAFETENSORS, TORCH_BIN = "model.safetensors", "pytorch_model.bin"


def is_eagle3(meta: dict[str, Any]) -> bool:
    archs = meta.get("architectures")
    named = isinstance(archs, list) and any(a in ARCHITECTURES for a in archs)
    return named or meta.get("speculators_model_type") == "eagle3"


def find_eagle3(spec: str) -> Path | None:
    """The folder of an EAGLE-3 head: a registry draft name, a path, or a hub id already in
    huggingface-hub's cache (never downloaded here); None when ``spec`` names none."""
    path = store.draft_path(spec) or Path(spec).expanduser()
    if not path.is_dir() and store.is_hub_id(spec):
        path = store.hub_snapshot(spec) or path
    if not (path / "config.json").is_file():
        return None
    try:
        return path if is_eagle3(read_config(path)) else None
    except MlxspecError:
        return None


def refuse_eagle3_export(spec: str) -> None:
    """``export-draft`` writes an mlx-lm model: an EAGLE-3 head has no such form."""
    if find_eagle3(spec) is not None:
        raise MlxspecError(f"{spec} is an EAGLE-3 head: it reads the target's hidden states, so it has no standalone "
                           "mlx-lm form; vLLM and SGLang load its folder as it is, speculators after "
                           "`export-draft --format speculators` (README, \"EAGLE-3 heads\")")


def verifier_for(model: str, target: Any, given: str | None = None) -> tuple[str, list[str]]:
    """The verifier a speculators head names (a hub id or a folder with the target's config.json,
    which speculators reads for the target's depth) and its architectures: ``given``, else the
    hub id the registry model came from, else ``model`` when it is a hub id or folder."""
    name = given or store.hub_id(target.name) or (model if store.is_hub_id(model) or Path(model).is_dir() else None)
    if name is None:
        raise MlxspecError(f"{model} has no hub id or folder a serving stack could load as the verifier: name one "
                           "with --verifier (the hub id it was converted from, or a Hugging Face folder of it)")
    folder = Path(name).expanduser()
    if folder.is_dir():
        name = str(folder.resolve())
        archs = read_config(folder).get("architectures") if (folder / "config.json").is_file() else None
        if archs:
            return name, list(archs)
    return name, [architecture(target.config.model_type)]


def export_eagle3(spec: str, target: Any, out: Path, layout: str, verifier: tuple[str, list[str]]) -> Path:
    """The EAGLE-3 head ``spec`` rewritten in ``layout`` (``LAYOUTS``), its tensors unchanged:
    stored at the precision its config names, the embedding table only if it has its own."""
    path = find_eagle3(spec)
    if path is None:
        raise MlxspecError(f"{spec} is not an EAGLE-3 head: --format {layout} rewrites one (a draft model exports "
                           "as --format mlx-lm)")
    meta = read_config(path)
    layer = meta.get("transformer_layer_config") if isinstance(meta.get("transformer_layer_config"), dict) else meta
    dtype = str(layer.get("torch_dtype") or layer.get("dtype") or "float16")
    ours = {"mlxspec": meta["mlxspec"]} if isinstance(meta.get("mlxspec"), dict) else None
    return save_eagle3(load_eagle3(path, target), out, extra=ours, layout=layout, verifier=verifier,
                       dtype=dtype if dtype in FLOAT_DTYPES else "float16")


def _int(meta: dict[str, Any], key: str, where: Path, default: int | None = None) -> int:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MlxspecError(f"EAGLE-3 head {where}: config.json's {key} is {value!r}, not a positive integer")
    return value


def aux_layers(meta: dict[str, Any], target_layers: int, where: Path) -> tuple[int, ...]:
    """The target blocks whose input the head reads, ascending (module docstring)."""
    ids, nested = meta.get("eagle_aux_hidden_state_layer_ids"), False
    if not ids and isinstance(meta.get("eagle_config"), dict):
        ids, nested = meta["eagle_config"].get("eagle_aux_hidden_state_layer_ids"), True
    if not ids:
        return default_aux_layers(target_layers)
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise MlxspecError(f"EAGLE-3 head {where}: eagle_aux_hidden_state_layer_ids is {ids!r}, not a list of integers")
    blocks = [i + 1 for i in ids] if nested and ids[0] == 1 else list(ids)
    if len(set(blocks)) != len(blocks):
        raise MlxspecError(f"EAGLE-3 head {where}: eagle_aux_hidden_state_layer_ids {ids} repeats a layer")
    return tuple(sorted(blocks))


def rope(layer: dict[str, Any], where: Path) -> tuple[float, dict[str, Any] | None]:
    """The head's rope base and scaling, wherever its layout keeps them: at the top of the layer's
    config (EAGLE, SpecForge, transformers 4) or under ``rope_parameters`` (transformers 5, as
    speculators writes it). A base that is nowhere is an error: 10,000 in its place keeps the
    output exact but silently lowers acceptance on a target trained at another base."""
    rp = layer.get("rope_parameters")
    if rp is not None and not isinstance(rp, dict):
        raise MlxspecError(f"EAGLE-3 head {where}: rope_parameters is {rp!r}, not an object")
    layer = lift_rope_parameters(layer)
    theta = layer.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        found = "has none" if theta is None else f"is {theta!r}"
        raise MlxspecError(f"EAGLE-3 head {where}: the rope base (rope_theta, at the top of the layer's config or "
                           f"under rope_parameters) {found}")
    scaling = layer.get("rope_scaling") or None
    if scaling is not None and not isinstance(scaling, dict):
        raise MlxspecError(f"EAGLE-3 head {where}: rope_scaling is {scaling!r}, not an object")
    return float(theta), scaling


def read_eagle3_config(path: Path, target_layers: int) -> tuple[Eagle3Config, str]:
    """The head's architecture from its config.json (weights decide ``own_embedding`` and
    ``fc_bias`` later), and its layout: ``speculators`` or ``eagle``."""
    meta = read_config(path)
    if not is_eagle3(meta):
        raise MlxspecError(f"{path}: config.json does not describe an EAGLE-3 head")
    speculators = meta.get("speculators_model_type") == "eagle3"
    layer = meta.get("transformer_layer_config") if speculators else meta
    if not isinstance(layer, dict):
        raise MlxspecError(f"EAGLE-3 head {path}: config.json has no transformer_layer_config object")
    if layer.get("num_hidden_layers", 1) != 1:
        raise MlxspecError(f"EAGLE-3 head {path}: {layer.get('num_hidden_layers')} decoder layers; "
                           "the published EAGLE-3 heads (and this loader) have one")
    if layer.get("hidden_act", "silu") != "silu":
        raise MlxspecError(f"EAGLE-3 head {path}: hidden_act {layer.get('hidden_act')!r}; only silu is implemented")
    if meta.get("norm_before_fc"):
        raise MlxspecError(f"EAGLE-3 head {path}: norm_before_fc is not implemented")
    hidden, vocab = _int(layer, "hidden_size", path), _int(layer, "vocab_size", path)
    rope_theta, rope_scaling = rope(layer, path)
    heads = _int(layer, "num_attention_heads", path)
    cfg = Eagle3Config(
        hidden_size=hidden, intermediate_size=_int(layer, "intermediate_size", path), num_heads=heads,
        num_kv_heads=_int(layer, "num_key_value_heads", path, heads),
        draft_vocab=_int(meta, "draft_vocab_size", path, vocab), target_vocab=vocab,
        target_hidden=_int(meta, "target_hidden_size", path, hidden) if meta.get("target_hidden_size") else hidden,
        aux_layers=aux_layers(meta, target_layers, path),
        head_dim=layer.get("head_dim") if isinstance(layer.get("head_dim"), int) else None,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position=int(layer.get("max_position_embeddings", 2048)),
        norm_before_residual=bool(meta.get("norm_before_residual", False)),
        attention_bias=bool(layer.get("attention_bias", False)), mlp_bias=bool(layer.get("mlp_bias", False)),
    )
    if cfg.fc_in == cfg.hidden_size:  # the head could not tell the target's features from its own
        raise MlxspecError(f"EAGLE-3 head {path}: fc reads {cfg.fc_in} values, the head's own width; "
                           "its inputs would be ambiguous")
    return cfg, "speculators" if speculators else "eagle"


def read_weights(path: Path) -> dict[str, mx.array]:
    """The head's tensors by their published names, from safetensors or (only through
    ``torch.load(weights_only=True)``) ``pytorch_model.bin``."""
    if (path / SAFETENSORS).is_file():
        try:
            return mx.load(str(path / SAFETENSORS))
        except (OSError, ValueError, RuntimeError) as e:
            raise MlxspecError(f"EAGLE-3 head {path}: cannot read {SAFETENSORS} ({str(e).splitlines()[0]})") from None
    if not (path / TORCH_BIN).is_file():
        raise MlxspecError(f"EAGLE-3 head {path}: neither {SAFETENSORS} nor {TORCH_BIN} is there")
    try:
        import torch
    except ImportError:
        raise MlxspecError(f"EAGLE-3 head {path}: reading {TORCH_BIN} needs torch (pip install 'mlxspec[torch]')") from None
    try:
        state = torch.load(path / TORCH_BIN, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a damaged or hostile file; all mean "unreadable"
        raise MlxspecError(f"EAGLE-3 head {path}: cannot read {TORCH_BIN} ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else 'damaged'})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise MlxspecError(f"EAGLE-3 head {path}: {TORCH_BIN} is not a dict of tensors")
    out = {}
    for k, v in state.items():
        v = v.detach().cpu()
        out[k] = mx.array(v.float().numpy() if v.is_floating_point() else v.numpy())
    return out


def published_to_ours(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Names as ``Eagle3Head`` spells them: ``layers.0.`` (speculators, vLLM) is ``midlayer.``
    (EAGLE, SpecForge, SGLang); a leading ``model.`` goes."""
    out = {}
    for k, v in weights.items():
        k = k.removeprefix("model.")
        out["midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k] = v
    return out


def vocabulary(cfg: Eagle3Config, weights: dict[str, mx.array], path: Path) -> mx.array:
    """The target id of each draft column, from ``d2t`` (checked: in range, each once)."""
    d2t = weights.pop("d2t", None)
    weights.pop("t2d", None)  # derived from d2t
    if d2t is None:
        if cfg.draft_vocab != cfg.target_vocab:
            raise MlxspecError(f"EAGLE-3 head {path}: a draft vocabulary of {cfg.draft_vocab} tokens needs d2t, "
                               "which the weights lack")
        return mx.arange(cfg.draft_vocab, dtype=mx.int32)
    if d2t.shape != (cfg.draft_vocab,) or not mx.issubdtype(d2t.dtype, mx.integer):
        raise MlxspecError(f"EAGLE-3 head {path}: d2t is {d2t.dtype} {tuple(d2t.shape)}, expected "
                           f"{cfg.draft_vocab} integers")
    ids = np.array(ids_from_d2t(d2t))
    if ids.min() < 0 or ids.max() >= cfg.target_vocab or len(np.unique(ids)) != len(ids):
        raise MlxspecError(f"EAGLE-3 head {path}: d2t maps draft tokens outside the target's {cfg.target_vocab} "
                           "tokens or twice onto one")
    return mx.array(ids.astype(np.int32))


def check_target(cfg: Eagle3Config, path: Path, target, tokenizer_sha256: str | None = None) -> None:
    """One clear line when the head was made for another target. Published heads name no
    tokenizer (only its size); one trained here names its fingerprint, which is checked."""
    t = target.config
    if tokenizer_sha256 and getattr(target, "tokenizer", None) is not None:
        if tokenizer_sha256 != tokenizer_fingerprint(target.tokenizer):
            raise MlxspecError(f"EAGLE-3 head {path} was trained for a different tokenizer than target {target.name!r}")
    if (cfg.target_vocab, cfg.target_hidden) != (t.vocab_size, t.hidden_size):
        raise MlxspecError(
            f"EAGLE-3 head {path} is for a target with vocabulary {cfg.target_vocab} and hidden size "
            f"{cfg.target_hidden}; {target.name!r} has {t.vocab_size} and {t.hidden_size}")
    if cfg.aux_layers[0] < 0 or cfg.aux_layers[-1] > t.num_layers:
        raise MlxspecError(f"EAGLE-3 head {path} reads target layers {list(cfg.aux_layers)}; {target.name!r} has "
                           f"{t.num_layers} layers")
    if not cfg.own_embedding and cfg.hidden_size != t.hidden_size:
        raise MlxspecError(f"EAGLE-3 head {path} has width {cfg.hidden_size} and no embedding table of its own; "
                           f"{target.name!r}'s embeddings have width {t.hidden_size}")


def load_eagle3(path: Path, target, dtype: mx.Dtype = mx.float32) -> Eagle3Head:
    """A published EAGLE-3 head wired to ``target`` (a ``LoadedModel`` run by our decoder)."""
    cfg, _ = read_eagle3_config(path, target.config.num_layers)
    weights = published_to_ours(read_weights(path))
    ids = vocabulary(cfg, weights, path)
    cfg = replace(cfg, own_embedding="embed_tokens.weight" in weights, fc_bias="fc.bias" in weights)
    ours = read_config(path).get("mlxspec")
    check_target(cfg, path, target, ours.get("tokenizer_sha256") if isinstance(ours, dict) else None)
    head = Eagle3Head(cfg, ids, target.model.model.embed_tokens)
    expected = dict(tree_flatten(head.parameters()))
    missing, unknown = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unknown:
        raise MlxspecError(f"EAGLE-3 head {path}: weights missing {missing[:3]}, unexpected {unknown[:3]} "
                           "(truncated, or another architecture)")
    wrong = [f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})" for k, v in weights.items()
             if v.shape != expected[k].shape]
    if wrong:
        raise MlxspecError(f"EAGLE-3 head {path}: {wrong[0]} does not fit its config")
    head.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
    mx.eval(head.parameters())
    return head


def published_config(head: Eagle3Head, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json of the SafeAILab/SpecForge layout, which vLLM and SGLang both load."""
    c = head.cfg
    return {
        "architectures": [WRITTEN_ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.dims_per_head,
        "vocab_size": c.target_vocab, "draft_vocab_size": c.draft_vocab, "target_hidden_size": c.target_hidden,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position, "attention_bias": c.attention_bias, "mlp_bias": c.mlp_bias,
        "norm_before_residual": c.norm_before_residual, "tie_word_embeddings": False, "torch_dtype": "float16",
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layers), **(extra or {}),
    }


def speculators_config(head: Eagle3Head, verifier: str, verifier_architectures: list[str],
                       extra: dict[str, Any] | None = None, dtype: str = "float16") -> dict[str, Any]:
    """config.json of the speculators layout, as speculators 0.9 saves an ``Eagle3SpeculatorConfig``:
    the decoder layer's llama config nested (rope under ``rope_parameters``, transformers 5's
    place), the head's own fields and tapped blocks at the top, and ``speculators_config`` naming
    the verifier (``verifier``: a hub id or folder whose config.json speculators reads for the
    target's depth)."""
    c = head.cfg
    layer = {
        "model_type": "llama", "hidden_act": "silu", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": 1, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.dims_per_head, "vocab_size": c.target_vocab,
        "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position, "attention_bias": c.attention_bias,
        "mlp_bias": c.mlp_bias, "tie_word_embeddings": False, "dtype": dtype,
        "rope_parameters": {**(c.rope_scaling or {}), "rope_theta": c.rope_theta, "rope_type": rope_type(c.rope_scaling)},
    }
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "transformer_layer_config": layer,
        "draft_vocab_size": c.draft_vocab, "target_hidden_size": c.target_hidden,
        "norm_before_residual": c.norm_before_residual, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "embed_requires_grad": False, "eagle_aux_hidden_state_layer_ids": list(c.aux_layers),
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [SPECULATORS_PROPOSAL],
                               "default_proposal_method": "greedy",
                               "verifier": {"name_or_path": verifier, "architectures": verifier_architectures}},
        **(extra or {}),
    }


def save_eagle3(head: Eagle3Head, out: Path, embed_table: mx.array | None = None, extra: dict[str, Any] | None = None,
                dtype: str = "float16", layout: str = "specforge", verifier: tuple[str, list[str]] | None = None) -> Path:
    """``config.json`` + ``model.safetensors`` in a published layout (``LAYOUTS``; the
    speculators layout needs ``verifier``, the target's hub id or folder and architectures).
    ``embed_table``: the target's embedding table, stored with the head (as published heads do)
    when it has none of its own, so a serving engine needs nothing but this folder and the target."""
    if layout not in LAYOUTS:
        raise MlxspecError(f"unknown EAGLE-3 layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    if layout == "speculators" and verifier is None:
        raise MlxspecError("the speculators layout names its verifier (the target's hub id or folder)")
    out.mkdir(parents=True, exist_ok=True)
    cast = FLOAT_DTYPES[dtype]
    weights = {k: v.astype(cast) for k, v in tree_flatten(head.parameters())}
    if "embed_tokens.weight" not in weights and embed_table is not None:
        weights["embed_tokens.weight"] = embed_table.astype(cast)
    weights["d2t"] = d2t_from_ids(head.vocab_ids)
    weights["t2d"] = t2d_from_ids(head.vocab_ids, head.cfg.target_vocab)
    if layout == "speculators":
        weights = {"layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k: v
                   for k, v in weights.items()}
    save_safetensors(out / SAFETENSORS, weights)
    if layout == "speculators":
        config = speculators_config(head, verifier[0], verifier[1], extra, dtype)
    else:
        config = {**published_config(head, extra), "torch_dtype": dtype}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
