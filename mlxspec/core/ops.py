"""The array operations the engine and the drafters call, for MLX.

``mlxspec/torchpath/ops.py`` has the same names for PyTorch. The engine and the drafters are
written once against these names and take them from the module they run (``ops_for``): a
torch module carries ``ops`` as an attribute, anything else (our llama, mlx-lm's classes, the
trained drafts) runs on MLX. The mathematics lives where it did (``verify``, ``sampling``,
``cache``, ``prefill``); this module only names it, plus the few small steps the loop needs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import mlx.core as mx

from mlxspec.core.cache import keep_rows  # noqa: F401  (re-exported for the engine)
from mlxspec.core.prefill import prefill  # noqa: F401
from mlxspec.core.processors import process_logits, step_logprobs  # noqa: F401
from mlxspec.core.sampling import (CoupledKey, child_logprobs, coupled_scores, logprobs, node_probs, probs, sample,  # noqa: F401
                                   sample_children, top_children)
from mlxspec.core.verify import (block_verify, greedy_verify, pad_vocab, rejection_verify,  # noqa: F401
                                 tree_greedy_verify, tree_residual_verify, tree_sample_verify)

# The backend seam: ``torchpath/ops.py`` exports the same names with the same parameters
# (``tests/test_layout.py`` checks), ``ops_for`` apart.
__all__ = ["async_evaluate", "astype", "block_verify", "child_logprobs", "concatenate", "coupled_scores", "evaluate", "from_numpy",
           "greedy_verify",
           "keep_rows", "key", "logprobs", "name", "node_probs", "node_stats", "ops_for", "pad_vocab", "prefill",
           "probs", "process_logits", "rejection_verify", "sample", "sample_children", "split", "stack",
           "step_logprobs", "synchronize", "tokens", "top_children", "tree_greedy_verify", "tree_residual_verify", "tree_sample_verify"]

name = "mlx"
evaluate = mx.eval
async_evaluate = mx.async_eval
synchronize = mx.synchronize
concatenate = mx.concatenate
stack = mx.stack


def ops_for(module: Any) -> ModuleType:
    """The ops a model, draft or head runs on: its own ``ops``, else these (MLX)."""
    return getattr(module, "ops", None) or sys.modules[__name__]


def tokens(ids: Sequence[int] | Any) -> mx.array:
    """Token ids (a list, a numpy array or an array, lazy stays lazy) as int32."""
    return ids.astype(mx.int32) if isinstance(ids, mx.array) else mx.array(ids, dtype=mx.int32)


def from_numpy(a: Any) -> mx.array:
    return mx.array(a)


def astype(x: mx.array, like: mx.array) -> mx.array:
    """``x`` in the dtype of ``like``."""
    return x.astype(like.dtype)


def key(seed: int) -> mx.array:
    """A random key from any integer seed, folded into the 64 bits a key holds (as the server does)."""
    return mx.random.key(seed % 2**64)


def split(key: mx.array | CoupledKey, n: int) -> mx.array | list[CoupledKey]:
    """``n`` independent keys (iterable, one per row); a ``CoupledKey``'s next ``n`` positions."""
    return key.split(n) if isinstance(key, CoupledKey) else mx.random.split(key, n)


def node_stats(logits: mx.array, ids: mx.array, parents: tuple[int, ...],
               params: Any) -> tuple[mx.array, mx.array, mx.array]:
    """Per node (lazy), from the verify pass's logits over [y, nodes]: the entropy of the
    target's distribution at its parent's row, that distribution's probability of the node's
    token, and its argmax (``events.NodeStats``)."""
    lp = logprobs(logits, params)  # at T = 0: the softmax
    rows = mx.array([p + 1 for p in parents], mx.int32)
    at_parent = lp[rows]
    p = mx.exp(at_parent)
    entropy = -mx.where(p > 0, p * at_parent, 0.0).sum(axis=-1)
    picked = mx.take_along_axis(at_parent, ids.astype(mx.int32)[:, None], axis=-1)[:, 0]
    return entropy, mx.exp(picked), mx.argmax(at_parent, axis=-1)
