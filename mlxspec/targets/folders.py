"""Draft and head folders, the formats this project trains and ships: ``config.json`` (format
``mlxspec-draft`` or ``mlxspec-eagle``), the weights the module owns with its head's vocabulary
ids (``draft.safetensors``, ``head.safetensors``) and a model card. Only what the module owns is
stored; the target's embedding table is attached at load time, after checking the folder was
trained for this target (tokenizer, vocabulary, hidden size).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxspec.core.drafters.draft_model import DraftConfig, DraftModel
from mlxspec.core.drafters.eagle import EagleConfig, EagleHead
from mlxspec.core.model import Llama
from mlxspec.errors import MlxspecError
from mlxspec.targets import store
from mlxspec.targets.export import export_folder
from mlxspec.targets.loading import read_config
from mlxspec.targets.weights import FLOAT_DTYPES, save_safetensors

DRAFT_FORMAT = "mlxspec-draft"
DRAFT_WEIGHTS = "draft.safetensors"
HEAD_FORMAT = "mlxspec-eagle"
HEAD_WEIGHTS = "head.safetensors"
CONFIG = "config.json"
CARD = "README.md"

# Every card this project writes states the licence of the weights it describes.
CARD_LICENCE = ("Licence: Apache-2.0, like mlxspec and the target whose embeddings it shares. The training "
                "text's sources and their licences: `mlxspec/training/SOURCES.md`.")


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the vocabulary (token -> id): what must match between draft and target."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])  # the wrapper forwards it
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()



def write_folder(module: nn.Module, vocab_ids: mx.array, out: Path, fmt: str, weights_name: str,
                 meta: dict[str, Any], dtype: str = "float16", card: str | None = None) -> Path:
    """A trained module's folder: its own weights (cast to ``dtype``) with the head's vocabulary
    ids, ``config.json`` with ``meta`` and an optional model card. Atomic per file."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(FLOAT_DTYPES[dtype]) for k, v in tree_flatten(module.parameters())}
    weights["vocab_ids"] = vocab_ids
    save_safetensors(out / weights_name, weights, fmt)
    (out / CONFIG).write_text(json.dumps({"format": fmt, "version": 1, **meta}, indent=2) + "\n")
    if card is not None:
        (out / CARD).write_text(card)
    return out


def save_draft(draft: DraftModel, out: Path, dtype: str = "float16", card: str | None = None,
               extra: dict[str, Any] | None = None) -> Path:
    """``config.json`` + ``draft.safetensors`` (+ a model card)."""
    return write_folder(draft, draft.vocab_ids, out, DRAFT_FORMAT, DRAFT_WEIGHTS,
                        {"draft": asdict(draft.cfg), **(extra or {})}, dtype, card)


def folder_format(path: Path) -> str | None:
    """The ``format`` a folder's config.json names (None when it has no readable one)."""
    try:
        return read_config(path).get("format") if path.is_dir() else None
    except MlxspecError:
        return None


def is_draft_folder(path: Path) -> bool:
    return folder_format(path) == DRAFT_FORMAT


def read_draft_config(path: Path) -> tuple[DraftConfig, dict[str, Any]]:
    try:
        meta = read_config(path)
    except MlxspecError as e:
        raise MlxspecError(f"{path}: not a readable mlxspec draft ({e})") from None
    if meta.get("format") != DRAFT_FORMAT:
        raise MlxspecError(f"{path}: config.json is not an {DRAFT_FORMAT} config")
    if not isinstance(meta.get("draft"), dict):
        raise MlxspecError(f"{path}: config.json has no draft config object")
    known = {f.name for f in fields(DraftConfig)}
    unknown = set(meta["draft"]) - known
    if unknown:
        raise MlxspecError(f"{path}: draft config has unknown fields {sorted(unknown)} (another architecture?)")
    return DraftConfig(**meta["draft"]), meta


def load_draft(path: Path, target, dtype: mx.Dtype = mx.float32) -> DraftModel:
    """A saved draft wired to ``target`` (a ``LoadedModel``): checks it was trained for this
    target's tokenizer and shapes, then shares the target's embedding table."""
    cfg, _ = read_draft_config(path)
    tcfg = target.config
    if cfg.tokenizer_sha256 != tokenizer_fingerprint(target.tokenizer):
        raise MlxspecError(f"draft {path} was trained for a different tokenizer than target {target.name!r}")
    if (cfg.target_vocab, cfg.target_hidden) != (tcfg.vocab_size, tcfg.hidden_size):
        raise MlxspecError(
            f"draft {path} was built for a target with vocab {cfg.target_vocab} and hidden {cfg.target_hidden}; "
            f"{target.name!r} has {tcfg.vocab_size} and {tcfg.hidden_size}")
    weights = read_weights(path, DRAFT_WEIGHTS, "draft")
    draft = DraftModel(cfg, weights.pop("vocab_ids"), target.model.model.embed_tokens)
    return fill(draft, weights, dtype, f"draft {path}")


def full_head(draft: DraftModel) -> mx.array:
    """The head as a full-vocabulary matrix: trained rows at ``vocab_ids``, zeros elsewhere.
    Standalone formats have no -inf logits, so outside tokens score exactly 0 there; they
    win only when every in-vocabulary logit is negative."""
    w = draft.lm_head.weight
    full = mx.zeros((draft.cfg.target_vocab, w.shape[1]), dtype=w.dtype)
    full[draft.vocab_ids] = w
    return full


def resolve_draft(spec: str, target) -> Path:
    """A draft spec (``default``, a registry draft name or a folder) -> its folder."""
    name = store.default_draft(target.name) if spec == "default" else spec
    if name is None:
        raise MlxspecError(f"the registry has no default draft for {target.name!r}; pass a draft folder")
    path = find_draft(name)
    if path is None:
        raise MlxspecError(f"{spec!r} is not a trained mlxspec draft (no {CONFIG} with format {DRAFT_FORMAT!r})")
    return path


def find_draft(name: str) -> Path | None:
    """The folder of a registry draft name or a trained-draft path; None if it is neither."""
    path = store.draft_path(name) or Path(name).expanduser()
    return path if is_draft_folder(path) else None


def as_llama(draft: DraftModel, target):
    """The draft as a plain full-vocabulary ``Llama``: the target's embedding table copied in,
    the reduced head widened (see ``full_head``). What other tools (mlx-lm) can run."""
    c = draft.cfg
    if "embed_proj" in draft:
        raise MlxspecError("a draft with its own hidden size has an input projection mlx-lm's llama lacks; "
                           "only drafts at the target's hidden size convert")
    model = Llama(replace(c.llama_config(), vocab_size=c.target_vocab))
    weights = {f"model.{k}": v for k, v in tree_flatten(draft.parameters()) if not k.startswith("lm_head")}
    weights["model.embed_tokens.weight"] = target.model.model.embed_tokens(mx.arange(c.target_vocab))
    weights["lm_head.weight"] = full_head(draft)
    model.load_weights(list(weights.items()), strict=True)
    return model


def export_mlx_lm(path: Path, target, out: Path) -> Path:
    """The draft at ``path`` as a standalone mlx-lm llama folder."""
    return export_folder(as_llama(load_draft(path, target, mx.float32), target), target.tokenizer, out)


# ----------------------------------------------------------------------------- eagle heads


def save_head(head: EagleHead, out: Path, dtype: str = "float16", card: str | None = None,
              extra: dict[str, Any] | None = None) -> Path:
    return write_folder(head, head.vocab_ids, out, HEAD_FORMAT, HEAD_WEIGHTS,
                        {"kind": "eagle", "head": head.cfg.to_dict(), **(extra or {})}, dtype, card)


def is_head_folder(path: Path) -> bool:
    return folder_format(path) == HEAD_FORMAT


def read_head_config(path: Path) -> tuple[EagleConfig, dict[str, Any]]:
    try:
        meta = read_config(path)
        cfg = meta["head"]
    except (MlxspecError, KeyError) as e:
        raise MlxspecError(f"{path}: not a readable mlxspec eagle head ({e})") from None
    if not isinstance(cfg, dict):
        raise MlxspecError(f"{path}: its head config is a {type(cfg).__name__}, not an object")
    unknown = set(cfg) - {f.name for f in fields(EagleConfig)}
    if unknown:
        raise MlxspecError(f"{path}: head config has unknown fields {sorted(unknown)} (another architecture?)")
    return EagleConfig(**cfg), meta


def check_target(cfg: EagleConfig, path: Path, target) -> None:
    """One clear error when the head was trained for another target."""
    t = target.config
    if (cfg.target_vocab, cfg.hidden_size) != (t.vocab_size, t.hidden_size):
        raise MlxspecError(
            f"head {path} was trained for a target with vocabulary {cfg.target_vocab} and hidden size "
            f"{cfg.hidden_size}; {target.name!r} has {t.vocab_size} and {t.hidden_size}")
    if cfg.tokenizer_sha256 != tokenizer_fingerprint(target.tokenizer):
        raise MlxspecError(f"head {path} was trained for a different tokenizer than target {target.name!r}")


def load_head(path: Path, target, dtype: mx.Dtype = mx.float32) -> EagleHead:
    cfg, _ = read_head_config(path)
    check_target(cfg, path, target)
    weights = read_weights(path, HEAD_WEIGHTS, "head")
    head = EagleHead(cfg, weights.pop("vocab_ids"), target.model.model.embed_tokens)
    return fill(head, weights, dtype, f"head {path}")


def read_weights(path: Path, file: str, what: str) -> dict[str, mx.array]:
    """A draft's or head's safetensors, with the ``vocab_ids`` every one of them carries."""
    try:
        weights = mx.load(str(path / file))
    except (OSError, ValueError, RuntimeError) as e:
        raise MlxspecError(f"{what} {path}: cannot read {file} ({e})") from None
    if "vocab_ids" not in weights:
        raise MlxspecError(f"{what} {path}: {file} has no vocab_ids (truncated, or not an mlxspec {what})")
    return weights


def fill(module: nn.Module, weights: dict[str, mx.array], dtype: mx.Dtype, what: str) -> Any:
    """``module`` with ``weights`` in ``dtype``, every one of them matched (``strict``)."""
    try:
        module.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
    except ValueError as e:
        raise MlxspecError(f"{what}: weights do not match its config ({e})") from None
    mx.eval(module.parameters())
    return module


def find_head(name: str) -> Path | None:
    """The folder of a registry draft name or a path, if it holds an eagle head."""
    path = store.draft_path(name) or Path(name).expanduser()
    return path if is_head_folder(path) else None
