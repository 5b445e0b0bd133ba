"""The project's own draft model: a few llama blocks on top of the target's embedding table,
with a reduced-vocabulary head.

Only what the draft adds is stored: its blocks, final norm, head rows and the token ids those
rows stand for. The embedding table is the target's, attached at load time, so a 2-layer draft
for a 135M target is ~12M parameters instead of ~40M.

The head scores only ``head_vocab`` tokens (the most frequent in the training data). Every
other token gets logit -inf, i.e. q = 0: the rejection rule stays exact (the target's mass
there is simply never proposed) and the head costs a fraction of the full 49,152-row one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxspec.core.model import Block, LlamaConfig, Unowned
from mlxspec.errors import MlxspecError

FORMAT = "mlxspec-draft"
WEIGHTS = "draft.safetensors"
CONFIG = "config.json"
CARD = "README.md"


@dataclass(frozen=True)
class DraftConfig:
    num_layers: int = 2
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_heads: int = 9
    num_kv_heads: int = 3
    head_vocab: int = 8192
    init: str = "target"  # "target": copy the target's first blocks, norm and head rows; "random"
    # Facts about the target the draft was built for, checked at load time.
    target_vocab: int = 49152
    target_hidden: int = 576
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    max_position: int = 8192
    tokenizer_sha256: str = ""

    def validate(self) -> None:
        if not 1 <= self.num_layers <= 4:
            raise MlxspecError(f"draft layers must be in 1..4, got {self.num_layers}")
        if self.hidden_size <= 0 or self.hidden_size % self.num_heads:
            raise MlxspecError(f"draft hidden size {self.hidden_size} must be a positive multiple of {self.num_heads} heads")
        if not 1 <= self.head_vocab <= self.target_vocab:
            raise MlxspecError(f"draft head vocabulary must be in 1..{self.target_vocab}, got {self.head_vocab}")
        if self.init not in ("target", "random"):
            raise MlxspecError(f"draft init must be 'target' or 'random', got {self.init!r}")
        if self.init == "target" and self.hidden_size != self.target_hidden:
            raise MlxspecError(
                f"--init target copies the target's blocks, so the hidden size must be the target's "
                f"({self.target_hidden}), got {self.hidden_size}; use --init random for another size")

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.head_vocab, hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_traditional=self.rope_traditional,
            max_position=self.max_position, tie_embeddings=False,
        )

    @classmethod
    def for_target(cls, target: LlamaConfig, tokenizer_sha256: str, **choices: Any) -> DraftConfig:
        """The target's shapes, overridden by the user's ``choices`` (layers, sizes, vocab)."""
        base = cls(
            hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
            num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
            head_vocab=min(cls.head_vocab, target.vocab_size),
            target_vocab=target.vocab_size, target_hidden=target.hidden_size,
            rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
            rope_traditional=target.rope_traditional, max_position=target.max_position,
            tokenizer_sha256=tokenizer_sha256,
        )
        cfg = replace(base, **{k: v for k, v in choices.items() if v is not None})
        cfg.validate()
        return cfg


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the vocabulary (token -> id): what must match between draft and target."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])  # the wrapper forwards it
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


class DraftModel(nn.Module):
    """``model(tokens, cache)`` -> full-vocabulary logits (-inf outside the head's ids), which
    is what the engine's ``ModelDrafter`` expects; ``reduced_logits`` is what training uses."""

    def __init__(self, cfg: DraftConfig, vocab_ids: mx.array, embed: Callable[[mx.array], mx.array]):
        super().__init__()
        cfg.validate()
        if vocab_ids.shape != (cfg.head_vocab,):
            raise MlxspecError(f"draft head has {cfg.head_vocab} rows but {vocab_ids.shape[0]} vocabulary ids")
        self.cfg = cfg
        lc = cfg.llama_config()
        if cfg.hidden_size != cfg.target_hidden:
            self.embed_proj = nn.Linear(cfg.target_hidden, cfg.hidden_size, bias=False)
        self.layers = [Block(lc) for _ in range(cfg.num_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.head_vocab, bias=False)
        self._ids = Unowned(vocab_ids.astype(mx.int32))
        self._embed = Unowned(embed)

    @property
    def vocab_ids(self) -> mx.array:
        return self._ids.value

    @property
    def embed(self) -> Callable[[mx.array], mx.array]:
        """The target's embedding the draft reads (shared, so neither trained nor saved)."""
        return self._embed.value

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in self.layers]

    def reduced_logits(self, tokens: mx.array, cache: list | None = None, mask: Any = None,
                       positions: mx.array | None = None) -> mx.array:
        """(B, L) tokens -> (B, L, head_vocab) logits over ``vocab_ids``; ``mask`` and
        ``positions`` as in our llama module (tree drafting)."""
        if mask is None and tokens.shape[1] > 1:
            mask = "causal"
        h = mx.stop_gradient(self._embed.value(tokens))
        if "embed_proj" in self:
            h = self.embed_proj(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, mask, None if cache is None else cache[i], positions)
        return self.lm_head(self.norm(h))

    def __call__(self, tokens: mx.array, cache: list | None = None, mask: Any = None,
                 positions: mx.array | None = None, num_layers: int | None = None) -> mx.array:
        if num_layers is not None:
            raise MlxspecError("the trained draft runs all its layers")
        z = self.reduced_logits(tokens, cache, mask, positions)
        full = mx.full((*z.shape[:-1], self.cfg.target_vocab), -mx.inf, dtype=z.dtype)
        full[..., self.vocab_ids] = z
        return full

    def num_params(self) -> int:
        """Parameters the draft owns (the shared embedding table is not among them)."""
        return sum(v.size for _, v in tree_flatten(self.parameters()))


def init_from_target(draft: DraftModel, target) -> None:
    """Copy the target's first blocks and final norm, and its head rows for ``vocab_ids``
    (tied embeddings: the embedding rows). The target must hold float weights."""
    params = dict(tree_flatten(target.parameters()))
    if any(k.endswith(".scales") for k in params):
        raise MlxspecError("initialising a draft needs the target in float weights (load it with --dtype float32)")
    own: dict[str, mx.array] = {}
    for i in range(draft.cfg.num_layers):
        prefix = f"model.layers.{i}."
        own.update({f"layers.{i}.{k[len(prefix):]}": v for k, v in params.items() if k.startswith(prefix)})
    own["norm.weight"] = params["model.norm.weight"]
    head = params.get("lm_head.weight", params["model.embed_tokens.weight"])
    own["lm_head.weight"] = head[draft.vocab_ids]
    draft.load_weights(list(own.items()), strict=True)


def write_folder(module: nn.Module, vocab_ids: mx.array, out: Path, fmt: str, weights_name: str,
                 meta: dict[str, Any], dtype: str = "float16", card: str | None = None) -> Path:
    """A trained module's folder: its own weights (cast to ``dtype``) with the head's vocabulary
    ids, ``config.json`` with ``meta`` and an optional model card. Atomic per file."""
    out.mkdir(parents=True, exist_ok=True)
    cast = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}[dtype]
    weights = {k: v.astype(cast) for k, v in tree_flatten(module.parameters())}
    weights["vocab_ids"] = vocab_ids
    tmp = out / (weights_name + ".partial.safetensors")
    mx.save_safetensors(str(tmp), weights, metadata={"format": fmt})
    tmp.replace(out / weights_name)  # a reader never sees half a file
    (out / CONFIG).write_text(json.dumps({"format": fmt, "version": 1, **meta}, indent=2) + "\n")
    if card is not None:
        (out / CARD).write_text(card)
    return out


def save_draft(draft: DraftModel, out: Path, dtype: str = "float16", card: str | None = None,
               extra: dict[str, Any] | None = None) -> Path:
    """``config.json`` + ``draft.safetensors`` (+ a model card)."""
    return write_folder(draft, draft.vocab_ids, out, FORMAT, WEIGHTS, {"draft": asdict(draft.cfg), **(extra or {})},
                        dtype, card)


def is_draft_folder(path: Path) -> bool:
    try:
        return path.is_dir() and json.loads((path / CONFIG).read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_config(path: Path) -> tuple[DraftConfig, dict[str, Any]]:
    try:
        meta = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise MlxspecError(f"{path}: not a readable mlxspec draft ({e})") from None
    if meta.get("format") != FORMAT:
        raise MlxspecError(f"{path}: config.json is not an {FORMAT} config")
    known = {f.name for f in fields(DraftConfig)}
    unknown = set(meta["draft"]) - known
    if unknown:
        raise MlxspecError(f"{path}: draft config has unknown fields {sorted(unknown)} (another architecture?)")
    return DraftConfig(**meta["draft"]), meta


def load_draft(path: Path, target, dtype: mx.Dtype = mx.float32) -> DraftModel:
    """A saved draft wired to ``target`` (a ``LoadedModel``): checks it was trained for this
    target's tokenizer and shapes, then shares the target's embedding table."""
    cfg, _ = read_config(path)
    tcfg = target.config
    if cfg.tokenizer_sha256 != tokenizer_fingerprint(target.tokenizer):
        raise MlxspecError(f"draft {path} was trained for a different tokenizer than target {target.name!r}")
    if (cfg.target_vocab, cfg.target_hidden) != (tcfg.vocab_size, tcfg.hidden_size):
        raise MlxspecError(
            f"draft {path} was built for a target with vocab {cfg.target_vocab} and hidden {cfg.target_hidden}; "
            f"{target.name!r} has {tcfg.vocab_size} and {tcfg.hidden_size}")
    weights = mx.load(str(path / WEIGHTS))
    ids = weights.pop("vocab_ids")
    draft = DraftModel(cfg, ids, target.model.model.embed_tokens)
    try:
        draft.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
    except ValueError as e:
        raise MlxspecError(f"draft {path}: weights do not match its config ({e})") from None
    mx.eval(draft.parameters())
    return draft


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
    from mlxspec.targets import store

    name = store.default_draft(target.name) if spec == "default" else spec
    if name is None:
        raise MlxspecError(f"the registry has no default draft for {target.name!r}; pass a draft folder")
    path = find_draft(name)
    if path is None:
        raise MlxspecError(f"{spec!r} is not a trained mlxspec draft (no {CONFIG} with format {FORMAT!r})")
    return path


def find_draft(name: str) -> Path | None:
    """The folder of a registry draft name or a trained-draft path; None if it is neither."""
    from mlxspec.targets import store

    path = store.draft_path(name) or Path(name).expanduser()
    return path if is_draft_folder(path) else None


def as_llama(draft: DraftModel, target):
    """The draft as a plain full-vocabulary ``Llama``: the target's embedding table copied in,
    the reduced head widened (see ``full_head``). What other tools (mlx-lm) can run."""
    from mlxspec.core.model import Llama

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
    from mlxspec.targets.loading import export_folder

    return export_folder(as_llama(load_draft(path, target, mx.float32), target), target.tokenizer, out)
