"""The eagle head's folder: ``config.json`` (format ``mlxspec-eagle``), ``head.safetensors`` and a
model card. Only what the head owns is stored; the target's embedding table is attached at load
time, after checking the head was trained for this target (tokenizer, vocabulary, hidden size).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.core.drafters.eagle import EagleConfig, EagleHead
from mlxspec.core.model import LlamaConfig
from mlxspec.errors import MlxspecError
from mlxspec.training.draft import tokenizer_fingerprint, write_folder

FORMAT = "mlxspec-eagle"
WEIGHTS = "head.safetensors"
CONFIG = "config.json"


def config_for(target: LlamaConfig, tokenizer, head_vocab: int, intermediate_size: int | None = None) -> EagleConfig:
    """The head's shapes follow the target's (it reads and predicts the target's features);
    only its MLP may be wider or narrower (``intermediate_size``)."""
    if not 1 <= head_vocab <= target.vocab_size:
        raise MlxspecError(f"head vocabulary must be in 1..{target.vocab_size}, got {head_vocab}")
    if intermediate_size is not None and intermediate_size < 1:
        raise MlxspecError(f"the head's MLP width must be >= 1, got {intermediate_size}")
    return EagleConfig(
        hidden_size=target.hidden_size, intermediate_size=intermediate_size or target.intermediate_size,
        num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_vocab=head_vocab,
        target_vocab=target.vocab_size, rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
        rope_traditional=target.rope_traditional, max_position=target.max_position,
        tokenizer_sha256=tokenizer_fingerprint(tokenizer),
    )


def new_head(target, vocab_ids: mx.array, seed: int = 0, intermediate_size: int | None = None) -> EagleHead:
    """A fresh head for ``target`` (a ``LoadedModel`` in float weights) that starts as the
    identity on features: the input projection passes the feature through, the block's residual
    branches start at zero, and the output rows are the target's own for ``vocab_ids``. It
    first predicts f_{t+1} = f_t and learns the difference, instead of starting from noise.
    The rest (the block's inner projections) is MLX's default init drawn from ``seed``."""
    cfg = config_for(target.config, target.tokenizer, int(vocab_ids.shape[0]), intermediate_size)
    mx.random.seed(seed)
    head = EagleHead(cfg, vocab_ids, target.model.model.embed_tokens)
    params = dict(tree_flatten(target.model.parameters()))
    if any(k.endswith(".scales") for k in params):
        raise MlxspecError("training a head needs the target in float weights (load it with --dtype float32)")
    d = cfg.hidden_size
    rows = params.get("lm_head.weight", params["model.embed_tokens.weight"])[vocab_ids]
    attn, mlp = head.block.self_attn, head.block.mlp
    head.load_weights([
        ("lm_head.weight", rows),
        ("fc.weight", mx.concatenate([mx.eye(d), mx.zeros((d, d))], axis=1)),
        ("block.self_attn.o_proj.weight", mx.zeros_like(attn.o_proj.weight)),
        ("block.mlp.down_proj.weight", mx.zeros_like(mlp.down_proj.weight)),
    ], strict=False)
    return head


def save_head(head: EagleHead, out: Path, dtype: str = "float16", card: str | None = None,
              extra: dict[str, Any] | None = None) -> Path:
    return write_folder(head, head.vocab_ids, out, FORMAT, WEIGHTS,
                        {"kind": "eagle", "head": head.cfg.to_dict(), **(extra or {})}, dtype, card)


def is_head_folder(path: Path) -> bool:
    try:
        return path.is_dir() and json.loads((path / CONFIG).read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_config(path: Path) -> tuple[EagleConfig, dict[str, Any]]:
    try:
        meta = json.loads((path / CONFIG).read_text())
        cfg = meta["head"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MlxspecError(f"{path}: not a readable mlxspec eagle head ({e})") from None
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
    cfg, _ = read_config(path)
    check_target(cfg, path, target)
    try:
        weights = mx.load(str(path / WEIGHTS))
    except (OSError, ValueError, RuntimeError) as e:
        raise MlxspecError(f"head {path}: cannot read {WEIGHTS} ({e})") from None
    if "vocab_ids" not in weights:
        raise MlxspecError(f"head {path}: {WEIGHTS} has no vocab_ids (truncated or not an eagle head)")
    head = EagleHead(cfg, weights.pop("vocab_ids"), target.model.model.embed_tokens)
    try:
        head.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
    except ValueError as e:
        raise MlxspecError(f"head {path}: weights do not match its config ({e})") from None
    mx.eval(head.parameters())
    return head


def find_head(name: str) -> Path | None:
    """The folder of a registry draft name or a path, if it holds an eagle head."""
    from mlxspec.targets import store

    path = store.draft_path(name) or Path(name).expanduser()
    return path if is_head_folder(path) else None
