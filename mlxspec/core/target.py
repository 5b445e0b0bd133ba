"""The seam between the engine and the model it verifies with.

The engine needs little of a target: a fresh rollback-able cache, and a forward pass over a few
tokens that may carry an explicit attention mask and per-token positions (trees need both) and
may also return the final hidden states (drafters that read the target's features need them).
Our llama module implements this directly; anything else (mlx-lm's own model classes, a
PyTorch module) stands behind it with an adapter that states what it can do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx


@dataclass(frozen=True)
class Capabilities:
    tree_masks: bool = False  # accepts an explicit (L, offset+L) mask and per-token positions
    partial_layers: bool = False  # can run only its first L blocks then norm + head (self:L)
    hidden_states: bool = False  # can return the final hidden state of every position, or the states entering chosen blocks
    # takes ``logit_rows=n``: the logits of the last n positions only (prefill reads one row of
    # its last chunk, none of the others; an eager backend would compute them all)
    logit_rows: bool = False


class Target(Protocol):
    capabilities: Capabilities

    def make_cache(self) -> list[Any]:
        """A fresh cache, one entry per layer; each must support ``trim``."""

    def __call__(
        self,
        tokens: mx.array,
        cache: list[Any] | None,
        mask: mx.array | str | None = None,
        positions: mx.array | None = None,
        num_layers: int | None = None,
        return_hidden: bool | tuple[int, ...] = False,
    ) -> mx.array | tuple[mx.array, mx.array]:
        """Logits (B, L, V) for ``tokens`` (B, L); with ``return_hidden`` also the final
        (normed) hidden states (B, L, D) the head reads, or, given block indices, the residual
        stream entering each of those blocks concatenated in ascending order (B, L, n*D): index
        0 is the embedding's output, index ``num_layers`` the last block's (before the norm)."""
