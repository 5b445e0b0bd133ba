"""A demonstration kind: the last token, proposed again K times. No weights."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from mlxspec.core import ops as mlx_ops
from mlxspec.core.drafters.base import Commit, Proposal, no_draft
from mlxspec.core.sampling import SamplingParams


class RepeatDrafter:
    wants_hidden = False
    commits_any = True
    draft_prior_ratio = 0.01

    def __init__(self, n: int = 1, ops: ModuleType = mlx_ops):
        self.name, self.ops = "repeat", ops

    def reset(self, prompt: list[int], hidden: Any = None) -> None:
        pass

    def offers(self, history: list[int]) -> bool:
        return bool(history)

    def propose(self, history: list[int], k: int, params: SamplingParams, key: Any) -> Proposal:
        return Proposal(self.ops.tokens([history[-1]] * k)) if k else no_draft(self.ops)

    def commit(self, commit: Commit) -> None:
        pass
