"""A fresh eagle head for a target, the start of its training. The head's architecture is
``core/drafters/eagle.py``; its folder format (save, load) is ``targets/folders.py``.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.core.drafters.eagle import EagleConfig, EagleHead
from mlxspec.core.model import LlamaConfig
from mlxspec.errors import MlxspecError
from mlxspec.targets.folders import tokenizer_fingerprint


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
