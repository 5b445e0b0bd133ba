"""Starting a draft for training: copy the target's first blocks, final norm and head rows.

The draft's architecture is ``core/drafters/draft_model.py``; its folder format (save, load,
export) is ``targets/folders.py``.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.core.drafters.draft_model import DraftModel
from mlxspec.errors import MlxspecError


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
