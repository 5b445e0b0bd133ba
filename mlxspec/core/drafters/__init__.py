"""Drafters: who proposes the tokens the target verifies. One module per kind:

* ``model``: any model with a compatible tokenizer, with its own KV cache; ``self:L`` is the
  target's own first L layers plus its final norm and head.
* ``ngram``: prompt lookup, no weights; deterministic, so its q is a point mass.
"""

from mlxspec.core.drafters.base import (
    MAX_K, NO_DRAFT, Commit, Drafter, FixedK, KPolicy, Proposal, TreeDrafter, can_branch, parse_k)
from mlxspec.core.drafters.model import ModelDrafter
from mlxspec.core.drafters.ngram import NgramDrafter

__all__ = ["MAX_K", "NO_DRAFT", "Commit", "Drafter", "FixedK", "KPolicy", "ModelDrafter", "NgramDrafter", "Proposal",
           "TreeDrafter", "can_branch", "parse_k"]
