"""The names ``core.ops`` gives the engine and the drafters, for torch.

torch runs eagerly, so ``evaluate`` and ``async_evaluate`` have nothing to do but wait for an
accelerator; a key is a plain int (``sampling.split_key``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mlxspec.core.prefill import chunked
from mlxspec.torchpath.cache import keep_rows  # noqa: F401  (re-exported for the engine)
from mlxspec.torchpath.processors import process_logits, step_logprobs  # noqa: F401
from mlxspec.core.sampling import CoupledKey
from mlxspec.torchpath.sampling import categorical, coupled_scores, generator, logprobs, probs, sample, split_key  # noqa: F401
from mlxspec.torchpath.verify import (block_verify, greedy_verify, pad_vocab, rejection_verify,  # noqa: F401
                                      tree_greedy_verify, tree_residual_verify, tree_sample_verify)

# ``core.ops``'s names (its ``ops_for`` apart), with the same parameters.
__all__ = ["async_evaluate", "astype", "block_verify", "child_logprobs", "concatenate", "coupled_scores", "evaluate", "from_numpy",
           "greedy_verify",
           "keep_rows", "key", "logprobs", "name", "node_probs", "node_stats", "pad_vocab", "prefill", "probs",
           "process_logits", "rejection_verify", "sample", "sample_children", "split", "stack", "step_logprobs",
           "synchronize", "tokens",
           "top_children", "tree_greedy_verify", "tree_residual_verify", "tree_sample_verify"]

name = "torch"
stack = torch.stack


def concatenate(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` on the device of the last part (ids made on the host meet drafts made on
    an accelerator)."""
    device = xs[-1].device
    return torch.cat([x.to(device) for x in xs])


def evaluate(*_: Any) -> None:
    """Nothing is lazy on torch; kept so the loop reads the same on both backends."""


def async_evaluate(*_: Any) -> None:
    pass


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def tokens(ids: Sequence[int] | Any) -> torch.Tensor:
    """Token ids (a list, a numpy array or a tensor) as int32 (a tensor on its own device, else
    on the CPU: the models move their inputs to their device)."""
    if isinstance(ids, torch.Tensor):
        return ids.to(torch.int32)
    return torch.as_tensor(np.asarray(ids, dtype=np.int32))


def from_numpy(a: Any) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def astype(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(dtype=like.dtype, device=like.device)


def key(seed: int) -> int:
    """A random key from any integer seed, folded into the 64 bits a key holds (as the server does)."""
    return seed % 2**64


def split(key: int | CoupledKey, n: int) -> list[int] | list[CoupledKey]:
    return key.split(n) if isinstance(key, CoupledKey) else split_key(key, n)


def prefill(model: Any, cache: list, ids: list[int], num_layers: int | None = None,
            return_hidden: bool | tuple[int, ...] = False, stop: Callable[[], bool] | None = None) -> Any:
    """``core.prefill.prefill`` for torch: the prompt in chunks, the last position's logits
    and, with ``return_hidden``, the hidden states of every position (L, D); ``stop`` as there."""
    return chunked(model, cache, ids, num_layers, return_hidden, lambda chunk: tokens(chunk)[None], torch.cat,
                   stop=stop)


def top_children(logits: torch.Tensor, branch: int) -> torch.Tensor:
    """(n, V) logits -> (n, branch) the most likely tokens of each row, best first, ties to
    the lower id as MLX's CPU partition keeps them."""
    order = torch.sort(-logits.float(), dim=-1, stable=True).indices[:, :branch]
    return order.to(torch.int32)


def sample_children(logits: torch.Tensor, branch: int, params: Any, key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``core.sampling.sample_children``: (n, branch) children drawn independently from each
    row's sampling distribution, and those distributions (n, V)."""
    lp = logprobs(logits, params)
    picks = categorical(lp[:, None, :].expand(-1, branch, -1), generator(key, lp.device))
    return picks, torch.exp(lp)


def node_probs(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, params: Any) -> torch.Tensor:
    """``core.sampling.node_probs``: each picked child's probability at its parent's row."""
    lp = logprobs(logits, params)  # at T = 0: the softmax
    return torch.exp(lp[rows.long(), picked.long()])


def child_logprobs(logits: torch.Tensor, top: torch.Tensor, params: Any) -> torch.Tensor:
    """``core.sampling.child_logprobs``: each picked column's log-probability under its row."""
    lp = logprobs(logits, params)  # at T = 0: the softmax
    return lp.gather(-1, top.long())


def node_stats(logits: torch.Tensor, ids: torch.Tensor, parents: tuple[int, ...],
               params: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``core.ops.node_stats``: per node, the target's entropy at its parent's row, its
    probability of the node's token there, and its argmax there."""
    lp = logprobs(logits, params)  # at T = 0: the softmax
    at_parent = lp[torch.tensor([p + 1 for p in parents], device=lp.device)]
    p = torch.exp(at_parent)
    entropy = -torch.where(p > 0, p * at_parent, torch.zeros_like(p)).sum(dim=-1)
    picked = at_parent.gather(-1, ids.long().to(lp.device)[:, None])[:, 0]
    return entropy, torch.exp(picked), at_parent.argmax(dim=-1)
