"""What every drafter is: the protocol the engine drafts through, and the K it may ask for."""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError

MAX_K = 64


class Drafter(Protocol):
    name: str

    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence whose committed tokens are ``prompt``."""

    def propose(self, history: list[int], k: int, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array | None]:
        """Up to ``k`` draft tokens after ``history`` (int32, lazy) and the probabilities they
        were sampled from, (k, V), or None for a deterministic drafter."""

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        """The target kept ``drafted[:accepted]`` then emitted ``next_token``: roll back to that."""


def parse_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise MlxspecError(f"--k must be in 1..{MAX_K}, got {k}")
    return k
