"""Logits processors (repetition, presence and frequency penalties, logit bias) and the
log-probabilities reported for emitted tokens, for MLX.

A processor reads the tokens before the position it scores, so under speculation every row of a
verify pass is processed with its own prefix: the committed tokens, then the drafted tokens on
the way to that row (a chain's earlier drafts, a tree node's ancestors). Processed that way, each
row is exactly the row target-only decoding would have had after the same tokens, so greedy
verification and rejection sampling keep their guarantees. The definitions are mlx-lm's
(``mlx_lm.sample_utils.make_logits_processors``, applied in its order: bias, repetition,
presence, frequency); ``torchpath/processors.py`` mirrors them for torch.

Reported log-probabilities are, as mlx-lm's server reports them, the log-softmax of the processed
logits: after the processors, before temperature and the top-k / top-p / min-p filters.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError


def prefix_tails(history: Sequence[int], drafted: Sequence[int], parents: Sequence[int] | None,
                 width: int) -> tuple[np.ndarray, np.ndarray]:
    """The last ``width`` tokens of the prefix of every row of a verify pass over [y, drafted]
    (``history`` ends with y; row 0 is scored after ``history``, row 1 + i after node i and its
    ancestors; ``parents`` None is a chain). Returns int32 (rows, width), right-aligned, padded on
    the left with the row's last token, and float32 (rows, width), 1 where a token is real.

    The padding repeats a token already in the window, so writing a processed value there writes
    the same value twice; only the frequency count needs the 0/1 weights."""
    if not history:
        raise MlxspecError("a logits processor needs at least one token before the position it scores")
    parents = tuple(range(-1, len(drafted) - 1)) if parents is None else tuple(parents)
    rows = [list(history[-width:])]
    for tok, par in zip(drafted, parents):
        rows.append((rows[par + 1] + [int(tok)])[-width:])
    tails = np.empty((len(rows), width), np.int32)
    real = np.zeros((len(rows), width), np.float32)
    for i, row in enumerate(rows):
        tails[i] = [row[-1]] * (width - len(row)) + row
        real[i, width - len(row):] = 1.0
    return tails, real


def check_bias_ids(params: SamplingParams, vocab: int) -> None:
    """Refuse a logit bias for a token the model has no logit for (indexing past the row)."""
    bad = next((t for t, _ in params.logit_bias if t >= vocab), None)
    if bad is not None:
        raise MlxspecError(f"logit bias token id {bad} is outside the vocabulary (0..{vocab - 1})")


def process_logits(logits: mx.array, tails: mx.array, real: mx.array | None, params: SamplingParams) -> mx.array:
    """(rows, V) logits -> the processed logits, float32, each row with its own window: ``tails``
    (rows, W) as ``prefix_tails`` gives them, ``real`` their 0/1 weights (None: all real). Lazy."""
    x = logits.astype(mx.float32)
    if params.logit_bias:
        check_bias_ids(params, x.shape[-1])
        ids, bias = zip(*params.logit_bias)
        x = x.at[:, mx.array(ids, mx.int32)].add(mx.array(bias, mx.float32))
    tails = tails.astype(mx.int32)
    if params.repetition_penalty != 1:
        window = tails[:, -params.repetition_context_size:]
        seen = mx.take_along_axis(x, window, axis=-1)
        penalised = mx.where(seen < 0, seen * params.repetition_penalty, seen / params.repetition_penalty)
        x = mx.put_along_axis(x, window, penalised, axis=-1)
    if params.presence_penalty != 0:  # once per distinct token: a write, not an accumulation
        window = tails[:, -params.presence_context_size:]
        x = mx.put_along_axis(x, window, mx.take_along_axis(x, window, axis=-1) - params.presence_penalty, axis=-1)
    if params.frequency_penalty != 0:  # once per occurrence: an accumulation of the real entries
        size = params.frequency_context_size
        window = tails[:, -size:]
        weights = mx.ones(window.shape, mx.float32) if real is None else real[:, -size:]
        x = x.at[mx.arange(x.shape[0])[:, None], window].add(-params.frequency_penalty * weights)
    return x


def log_softmax(logits: mx.array) -> mx.array:
    """Normalised log-probabilities of each row, float32."""
    x = logits.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def top_logprobs(lp: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """(rows, V) log-probabilities -> the ``n`` most likely tokens of each row, best first, and
    their log-probabilities: int32 (rows, n), float32 (rows, n). A partition, then a sort of
    only those ``n``: a full sort of every row would cost more than the rest of the step."""
    top = mx.argpartition(-lp, kth=n - 1, axis=-1)[:, :n]
    values = mx.take_along_axis(lp, top, axis=-1)
    order = mx.argsort(-values, axis=-1)
    return mx.take_along_axis(top, order, axis=-1).astype(mx.int32), mx.take_along_axis(values, order, axis=-1)


def step_logprobs(logits: mx.array, parents: Sequence[int], drafts: mx.array | None, nxt: mx.array,
                  top: int) -> tuple:
    """What a verify pass (or a plain step, ``parents`` empty) can report of its emitted tokens,
    lazily, before the host knows which path was kept: every row's log-probability of the next
    token ``nxt`` (rows,), every node's under its parent's row (m,) (None without nodes), and
    with ``top`` > 0 each row's ``top`` alternatives, ids and log-probabilities (None, None
    otherwise). ``logits``: the processed rows of the pass. ``emitted_logprobs`` picks the path."""
    lp = log_softmax(logits)
    at_next = mx.take(lp, nxt.astype(mx.int32), axis=-1)
    at_node = None
    if parents:
        rows = lp[mx.array([p + 1 for p in parents], mx.int32)]
        at_node = mx.take_along_axis(rows, drafts.astype(mx.int32)[:, None], axis=-1)[:, 0]
    ids, values = top_logprobs(lp, top) if top > 0 else (None, None)
    return at_next, at_node, ids, values


Alternatives = tuple[tuple[int, float], ...]


def emitted_logprobs(evaluated: tuple, parents: Sequence[int], path: Sequence[int]) -> list[tuple[float, Alternatives | None]]:
    """The log-probability (and the alternatives, when asked for) of each token a step emits, in
    order: the accepted nodes ``path``, then the target's own token after the last of them, from
    ``step_logprobs``'s evaluated arrays. Host side, plain lists."""
    at_next, at_node, ids, values = (None if a is None else a.tolist() for a in evaluated)
    last = path[-1] if path else -1
    rows = [parents[i] + 1 for i in path] + [last + 1]
    chosen = [at_node[i] for i in path] + [at_next[last + 1]]
    if ids is None:
        return [(c, None) for c in chosen]
    return [(c, tuple(zip(ids[r], values[r]))) for c, r in zip(chosen, rows)]
