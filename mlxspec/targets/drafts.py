"""Turn a ``--draft`` spec into a drafter for a loaded target: the one place that knows where
drafts live (the registry, trained folders, model paths) and which spec names which kind.

A spec is parsed once, at the door (``parse_draft``: the only place that looks at the disk),
into a ``DraftSpec``; the drafter is then made from that, on MLX or (its torch twin) on torch.
Every kind is one row of ``KINDS``: what it is called, its help, how a spec is read, how it is
made on each backend, and whether it branches. The errors, ``--help`` checks and the chat's
list of drafters read this table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from mlxspec.targets.mlxlm import needs_family, require_native
from mlxspec.targets.tokenizer import check_compatible

DEFAULT_FALLBACK = "ngram:3"  # for targets the registry ships no draft for


def draft_float_dtype(target) -> mx.Dtype:
    """A trained draft runs in float16 beside a quantized (GPU) or half target, else float32."""
    return {"float16": mx.float16, "bfloat16": mx.bfloat16, "quantized": mx.float16}.get(target.dtype, mx.float32)


@dataclass(frozen=True)
class DraftSpec:
    """A ``--draft`` spec read once: its kind (a ``KINDS`` name), the kind's argument (N, L, a
    folder, a model spec), the text as given, and a cascade's parts."""

    kind: str
    arg: Any
    text: str
    parts: tuple[DraftSpec, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Kind:
    """One kind of drafter. ``read(spec)``: the kind's argument, or None when ``spec`` is not of
    this kind (an error when it is, but malformed). ``make(arg, name, target, dtype)``: the
    drafter on MLX. ``twin(arg, name, target)``: its torch twin (``target.source`` is the MLX
    model the torch target was copied from)."""

    name: str
    syntax: str
    help: str
    read: Callable[[str], Any]
    make: Callable[[Any, str, Any, str], Drafter]
    twin: Callable[[Any, str, Any], Drafter]
    branches: bool = True


def counted(kind: str, default: int) -> Callable[[str], int | None]:
    """A reader of ``kind`` or ``kind:N`` (``default`` when N is absent)."""

    def read(spec: str) -> int | None:
        if spec != kind and not spec.startswith(kind + ":"):
            return None
        n = spec.partition(":")[2] or str(default)
        if not n.isdigit():
            raise MlxspecError(f"bad drafter {spec!r}: expected {kind}:N with N an integer")
        return int(n)

    return read


def _read_self(spec: str) -> int | None:
    if spec != "self" and not spec.startswith("self:"):
        return None
    layers = spec.partition(":")[2]
    if not layers.isdigit():
        raise MlxspecError(f"bad drafter {spec!r}: expected self:L with L an integer")
    return int(layers)  # its range needs the target: checked when made


def _read_model(spec: str) -> Path | None:
    try:
        return resolve(spec)[1]
    except MlxspecError:
        return None


def _capable(target: Any, able: str, feature: str) -> None:
    """Refuse a drafter the target cannot serve (one run through mlx-lm's own class). Targets
    that declare nothing (test doubles around our llama) can do everything."""
    caps = getattr(getattr(target, "model", None), "capabilities", Capabilities(True, True, True))
    if not getattr(caps, able):
        raise needs_family(getattr(target.config, "model_type", target.name), feature)


def _make_self(layers: int, name: str, target: Any, dtype: str) -> Drafter:
    _capable(target, "partial_layers", f"the drafter {name!r} (the target's own first layers)")
    total = target.config.num_layers
    if not 1 <= layers < total:
        raise MlxspecError(f"bad drafter {name!r}: self:L needs 1 <= L < {total} (the target's layers)")
    return ModelDrafter(target.model, name, num_layers=layers)


def _make_trained(folder: Path, name: str, target: Any, dtype: str) -> Drafter:
    require_native(target, f"the trained draft {name!r} (it shares the target's embedding table)")
    return ModelDrafter(load_draft(folder, target, draft_float_dtype(target)), name)


def _make_head(folder: Path, name: str, target: Any, dtype: str) -> Drafter:
    _capable(target, "hidden_states", f"the eagle head {name!r} (it reads the target's hidden states)")
    return EagleDrafter(load_head(folder, target, draft_float_dtype(target)), name)


def _make_eagle3(folder: Path, name: str, target: Any, dtype: str) -> Drafter:
    _capable(target, "hidden_states", f"the EAGLE-3 head {name!r} (it reads the target's hidden states)")
    return EagleDrafter(load_eagle3(folder, target, draft_float_dtype(target)), name)


def _make_model(path: Path, name: str, target: Any, dtype: str) -> Drafter:
    draft = load(name, dtype)
    check_compatible(target.tokenizer, draft.tokenizer)
    return ModelDrafter(draft.model, draft.name)


def _lookup_twin(cls: type, **options: Any) -> Callable[[int, str, Any], Drafter]:
    """A weightless drafter's torch twin: the same class drafting torch's arrays."""

    def twin(n: int, name: str, target: Any) -> Drafter:
        from mlxspec.torchpath import ops as torch_ops  # imports torch, an optional extra

        return cls(n, ops=torch_ops, **options)

    return twin


def _weights_moved(make: Callable[[Any, str, Any, str], Drafter], head: bool) -> Callable[[Any, str, Any], Drafter]:
    """A drafter with weights on torch: made for the MLX model the target was copied from (the
    one loader reads weights as MLX arrays), then its weights copied into the torch twin."""

    def twin(arg: Any, name: str, target: Any) -> Drafter:
        from mlxspec.torchpath.load import draft_model_on_torch, head_on_torch  # imports torch, an optional extra

        return (head_on_torch if head else draft_model_on_torch)(make(arg, name, target.source, "float32"), target)

    return twin


def _self_twin(layers: int, name: str, target: Any) -> Drafter:
    _make_self(layers, name, target.source, "float32")  # the same checks as on MLX
    return ModelDrafter(target.model, name, num_layers=layers)


KINDS: tuple[Kind, ...] = (
    Kind("ngram", "ngram[:N]", "prompt lookup: what followed the last N tokens earlier in the text (N 3)",
         counted("ngram", 3), lambda n, name, t, d: NgramDrafter(n), _lookup_twin(NgramDrafter)),
    Kind("suffix", "suffix[:N]", "an index of the session's own text, its likeliest continuation (N 8)",
         counted("suffix", 8), lambda n, name, t, d: SuffixDrafter(n), _lookup_twin(SuffixDrafter)),
    Kind("self", "self:L", "the target's own first L layers with its final norm and head",
         _read_self, _make_self, _self_twin),
    Kind("trained", "a trained draft", "a draft trained here (`train-draft`), by registry name or folder",
         find_draft, _make_trained, _weights_moved(_make_trained, head=False)),
    Kind("eagle", "an eagle head", "a head reading the target's hidden states, by registry name or folder",
         find_head, _make_head, _weights_moved(_make_head, head=True)),
    Kind("eagle3", "an EAGLE-3 head", "a published EAGLE-3 head (EAGLE, SpecForge or speculators layout), by "
         "registry name, folder or hub id in the hub cache", find_eagle3, _make_eagle3,
         _weights_moved(_make_eagle3, head=True)),
    Kind("model", "a draft model", "any model with the target's tokenizer: a .gguf file, a model folder or a hub "
         "id in the hub cache", _read_model, _make_model, _weights_moved(_make_model, head=False)),
)
NAMED = "none, default, ngram[:N], suffix[:N], self:L, A+B (a cascade)"  # the kinds a spec names without a file


def kind(name: str) -> Kind:
    return next(k for k in KINDS if k.name == name)


def branching_kinds() -> str:
    """The kinds ``--tree`` can draft with, for its errors."""
    return ", ".join(k.syntax for k in KINDS if k.branches)


def parse_draft(spec: str) -> DraftSpec:
    """``spec`` read once, before anything loads: what kind of drafter it names, or one error
    line saying what it could have been. What depends on the target (self:L's range, a draft's
    fit) is checked when the drafter is made."""
    if spec in ("none", "", "default"):
        return DraftSpec(spec or "none", None, spec)
    if "+" in spec:
        parts = spec.split("+")
        if any(part in ("none", "", "default") for part in parts):
            raise MlxspecError(f"bad drafter {spec!r}: every part of a cascade A+B names a drafter")
        return DraftSpec("cascade", None, spec, tuple(parse_draft(part) for part in parts))
    for k in KINDS:
        if (arg := k.read(spec)) is not None:
            return DraftSpec(k.name, arg, spec)
    shipped = ", ".join(d["name"] for d in store.drafts())
    raise MlxspecError(f"unknown drafter {spec!r}: not one of {NAMED}, a shipped draft ({shipped}), a trained "
                       "draft or head folder, an EAGLE-3 head (folder or hub id in the hub cache), or a draft "
                       "model (.gguf file, model folder, or hub id in the hub cache)")


def check_draft_spec(spec: str) -> None:
    """Refuse, before anything loads, a ``--draft`` that names no drafter."""
    parse_draft(spec)


def is_head(spec: str) -> bool:
    """Whether ``spec`` names a head that drafts from the target's states (an eagle or EAGLE-3
    head): what a cascade puts behind lookup."""
    try:
        return parse_draft(spec).kind in ("eagle", "eagle3")
    except MlxspecError:
        return False


def make_drafter(spec: str | DraftSpec, target: Any, dtype: str = "auto") -> Drafter | None:
    """The drafter ``spec`` names, for ``target`` (a ``LoadedModel``) on its backend; None for
    ``none``. ``default`` is the registry's choice for the target (``DEFAULT_FALLBACK`` where it
    lists none); a cascade ``A+B`` drafts with A where it has a draft, else B
    (``drafters.cascade``), each part made for the target on its own."""
    parsed = spec if isinstance(spec, DraftSpec) else parse_draft(spec)
    if parsed.kind == "none":
        return None
    if parsed.kind == "default":  # resolved here: the default may be a cascade, made part by part below
        backend = getattr(target, "backend", "mlx")
        return make_drafter(store.default_draft(target.name, backend) or DEFAULT_FALLBACK, target, dtype)
    if parsed.kind == "cascade":
        return CascadeDrafter([make_drafter(part, target, dtype) for part in parsed.parts], parsed.text)
    k = kind(parsed.kind)
    if getattr(target, "backend", "mlx") == "mlx":
        return k.make(parsed.arg, parsed.text, target, dtype)
    return k.twin(parsed.arg, parsed.text, target)
