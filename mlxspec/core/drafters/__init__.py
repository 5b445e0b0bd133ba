"""Drafters: who proposes the tokens the target verifies. One module per kind, one protocol
(``base``); which spec string makes which kind is ``targets.drafts``' table."""

from mlxspec.core.drafters.base import (
    MAX_K, NO_DRAFT, TRAITS, Commit, Drafter, FixedK, KPolicy, Proposal, TreeDrafter, can_branch, parse_k, trait)
from mlxspec.core.drafters.model import ModelDrafter
from mlxspec.core.drafters.ngram import NgramDrafter

__all__ = ["MAX_K", "NO_DRAFT", "TRAITS", "Commit", "Drafter", "FixedK", "KPolicy", "ModelDrafter", "NgramDrafter", "Proposal",
           "TreeDrafter", "can_branch", "parse_k", "trait"]
