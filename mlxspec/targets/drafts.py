"""Turn a ``--draft`` spec into a drafter for a loaded target: the one place that knows where
drafts live (the registry, trained folders, model paths)."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.core.drafters import Drafter, ModelDrafter, NgramDrafter
from mlxspec.core.drafters.cascade import CascadeDrafter
from mlxspec.core.drafters.eagle import EagleDrafter
from mlxspec.core.drafters.suffix import SuffixDrafter
from mlxspec.core.target import Capabilities
from mlxspec.errors import MlxspecError
from mlxspec.targets import store
from mlxspec.targets.eagle3 import find_eagle3, load_eagle3
from mlxspec.targets.folders import find_draft, find_head, load_draft, load_head
from mlxspec.targets.loading import load, resolve
from mlxspec.targets.tokenizer import check_compatible
from mlxspec.targets.mlxlm import needs_family, require_native


def draft_float_dtype(target) -> mx.Dtype:
    """A trained draft runs in float16 beside a quantized (GPU) or half target, else float32."""
    return {"float16": mx.float16, "bfloat16": mx.bfloat16, "quantized": mx.float16}.get(target.dtype, mx.float32)


DEFAULT_FALLBACK = "ngram:3"  # for targets the registry ships no draft for
KINDS = "none, default, ngram[:N], suffix[:N], self:L, A+B (a cascade)"  # the drafters named by kind, not by a file


def counted(spec: str, kind: str, default: str) -> int | None:
    """N of a ``kind`` or ``kind:N`` spec (``default`` when absent); None for another spec."""
    if spec != kind and not spec.startswith(kind + ":"):
        return None
    n = spec.partition(":")[2] or default
    if not n.isdigit():
        raise MlxspecError(f"bad drafter {spec!r}: expected {kind}:N with N an integer")
    return int(n)


def is_head(spec: str) -> bool:
    """Whether ``spec`` names a head that drafts from the target's states (an eagle or EAGLE-3
    head, by registry name, folder or cached hub id): what a cascade puts behind lookup."""
    return find_head(spec) is not None or find_eagle3(spec) is not None


def check_draft_spec(spec: str) -> None:
    """Refuse, before anything loads, a ``--draft`` that names no drafter. What depends on the
    target (self:L's range, a draft's fit) is checked when the drafter is made."""
    if "+" in spec:
        for part in spec.split("+"):
            if part in ("none", ""):
                raise MlxspecError(f"bad drafter {spec!r}: every part of a cascade A+B names a drafter")
            check_draft_spec(part)
        return
    if spec in ("none", "", "default") or any(counted(spec, kind, "1") is not None for kind in ("ngram", "suffix")):
        return
    if spec == "self" or spec.startswith("self:"):  # its range needs the target: make_drafter checks it
        if not spec.partition(":")[2].isdigit():
            raise MlxspecError(f"bad drafter {spec!r}: expected self:L with L an integer")
        return
    if find_draft(spec) is not None or is_head(spec):
        return
    try:
        resolve(spec)
    except MlxspecError:
        shipped = ", ".join(d["name"] for d in store.drafts())
        raise MlxspecError(f"unknown drafter {spec!r}: not one of {KINDS}, a shipped draft ({shipped}), a trained "
                           "draft or head folder, an EAGLE-3 head (folder or hub id in the hub cache), or a draft "
                           "model (.gguf file, model folder, or hub id in the hub cache)") from None


def _require(target, able: bool, feature: str) -> None:
    """Refuse a drafter the target cannot serve (one run through mlx-lm's own class)."""
    if not able:
        raise needs_family(getattr(target.config, "model_type", target.name), feature)


def make_drafter(spec: str, target, dtype: str = "auto") -> Drafter | None:
    """``default``, ``none``, ``ngram[:N]``, ``suffix[:N]``, ``self:L``, a cascade ``A+B`` (A where it
    has a draft, else B: ``drafters.cascade``), a registry draft name, a trained
    draft or eagle-head folder, a published EAGLE-3 head (folder or cached hub id), or a draft
    model path (``LoadedModel`` target)."""
    if spec in ("none", ""):
        return None
    if spec == "default":  # resolved first: the default may be a cascade, made part by part below
        name = store.default_draft(target.name)
        return make_drafter(name or DEFAULT_FALLBACK, target, dtype)
    if "+" in spec:  # a cascade: each part made for this target (and moved to its backend) on its own
        check_draft_spec(spec)
        return CascadeDrafter([make_drafter(part, target, dtype) for part in spec.split("+")], spec)
    if getattr(target, "backend", "mlx") != "mlx":  # made for the MLX model the weights came from, then moved
        from mlxspec.torchpath.load import drafter_on_torch  # imports torch, an optional extra

        return drafter_on_torch(make_drafter(spec, target.source, "float32"), target)
    if (n := counted(spec, "ngram", "3")) is not None:
        return NgramDrafter(n)
    if (n := counted(spec, "suffix", "8")) is not None:
        return SuffixDrafter(n)
    # Targets that declare nothing (test doubles around our llama) can do everything.
    caps = getattr(getattr(target, "model", None), "capabilities", Capabilities(True, True, True))
    if spec.startswith("self:"):
        _require(target, caps.partial_layers, f"the drafter {spec!r} (the target's own first layers)")
        layers = spec.partition(":")[2]
        total = target.config.num_layers
        if not layers.isdigit() or not 1 <= int(layers) < total:
            raise MlxspecError(f"bad drafter {spec!r}: self:L needs 1 <= L < {total} (the target's layers)")
        return ModelDrafter(target.model, spec, num_layers=int(layers))
    folder = find_draft(spec)
    if folder is not None:
        require_native(target, f"the trained draft {spec!r} (it shares the target's embedding table)")
        return ModelDrafter(load_draft(folder, target, draft_float_dtype(target)), spec)
    head = find_head(spec)
    if head is not None:
        _require(target, caps.hidden_states, f"the eagle head {spec!r} (it reads the target's hidden states)")
        return EagleDrafter(load_head(head, target, draft_float_dtype(target)), spec)
    eagle3 = find_eagle3(spec)
    if eagle3 is not None:
        _require(target, caps.hidden_states, f"the EAGLE-3 head {spec!r} (it reads the target's hidden states)")
        return EagleDrafter(load_eagle3(eagle3, target, draft_float_dtype(target)), spec)
    check_draft_spec(spec)
    draft = load(spec, dtype)
    check_compatible(target.tokenizer, draft.tokenizer)
    return ModelDrafter(draft.model, draft.name)
