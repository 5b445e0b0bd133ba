"""Acceptance rules for speculative decoding (batch size 1).

The draft model proposes K tokens; the target model scores all of them in one forward pass and
produces K + 1 rows (row i predicts position i, row K the position after the last draft token).
A verifier decides how many draft tokens to keep and which token to emit after them:

* ``greedy_verify``: keep the longest prefix that matches the target's argmax.
* ``rejection_verify``: Leviathan et al. / Chen et al. speculative sampling, whose output is
  distributed exactly as sampling from the target alone.
* ``block_verify``: block verification (Sun et al., arXiv 2403.10444): a chain sampled from q
  judged as a whole, not token by token; as exact, never fewer tokens kept in expectation, and
  the same rule as ``rejection_verify`` for a single draft.
* ``tree_verify`` (``tree_greedy_verify``, ``tree_sample_verify``): a draft tree, verified in
  one pass, walked along the target's own choice at each node (argmax, or a sample of p).
* ``tree_residual_verify``: a tree whose children were *sampled* from the draft's q at their
  parent: at each node the children are tried in order, each kept with probability
  min(1, p'/q), p' <- norm(max(0, p' - q)) after each rejection (multi-round rejection, as
  SpecInfer); exact for children drawn independently from q, duplicates included.

Both are lazy: they only build mlx graphs (no ``.item()``, no ``mx.eval``), so the engine can
evaluate a whole step at once. The numpy helpers at the bottom are the exact reference the tests
and the docs use.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlxspec.core.tree import ancestry, children, depths

# Below this total the residual max(0, p - q) is rounding noise, not a distribution.
MIN_RESIDUAL_MASS = 1e-12


def _leading_true(mask: mx.array) -> mx.array:
    """Number of leading True entries of a 1-D boolean array, as an int32 scalar."""
    return mx.cumprod(mask.astype(mx.int32)).sum().astype(mx.int32)


def greedy_verify(draft: mx.array, target_logits: mx.array) -> tuple[mx.array, mx.array]:
    """Accept the longest prefix of ``draft`` that agrees with the target's argmax.

    draft: int (K,). target_logits: (K + 1, V).
    Returns (n_accepted, next_token), int32 scalars: n_accepted in [0, K], and next_token the
    target's argmax at position n_accepted (a correction if n < K, the bonus token if n == K).
    """
    target_tokens = mx.argmax(target_logits, axis=-1).astype(mx.int32)
    n_accepted = _leading_true(draft.astype(mx.int32) == target_tokens[:-1])
    next_token = mx.take(target_tokens, n_accepted)
    return n_accepted, next_token


def _residual_decision(
    draft: mx.array, q: mx.array | None, p: mx.array, u: mx.array
) -> tuple[mx.array, mx.array]:
    """``rejection_decide`` with the residual row left unnormalised, as ``rejection_verify``
    samples it (normalising first would change the draw's rounding)."""
    draft = draft.astype(mx.int32)
    p = p.astype(mx.float32)
    num_draft, vocab = draft.shape[0], p.shape[-1]

    p_draft = mx.take_along_axis(p[:-1], draft[:, None], axis=-1)[:, 0]
    if q is None:
        q = (mx.arange(vocab)[None, :] == draft[:, None]).astype(mx.float32)
        q_draft = mx.ones((num_draft,), dtype=mx.float32)
    else:
        q = q.astype(mx.float32)
        q_draft = mx.take_along_axis(q, draft[:, None], axis=-1)[:, 0]

    # u < p/q written without a division. When p >= q the token is always kept (this also
    # covers q(d) == 0, which a real drafter cannot propose), unless p(d) == 0: the target
    # must never emit a token it gives zero probability.
    accepted = mx.where(p_draft >= q_draft, p_draft > 0, u * q_draft < p_draft)
    n_accepted = _leading_true(accepted)

    # A zero draft row at K makes the residual there p_K itself: the bonus token.
    q = mx.concatenate([q, mx.zeros((1, vocab), dtype=mx.float32)], axis=0)
    p_row, q_row = mx.take(p, n_accepted, axis=0), mx.take(q, n_accepted, axis=0)
    residual = mx.maximum(p_row - q_row, 0.0)
    # An empty residual only arises when p ~= q up to rounding (so a rejection is nearly
    # impossible) or from unnormalised inputs; sampling p then avoids log(0) everywhere and
    # still never emits a token with p == 0.
    residual = mx.where(residual.sum() > MIN_RESIDUAL_MASS, residual, p_row)
    return n_accepted, residual


def rejection_decide(
    draft: mx.array, q: mx.array | None, p: mx.array, u: mx.array
) -> tuple[mx.array, mx.array]:
    """The speculative-sampling decision for given uniforms ``u`` (K,) in [0, 1), apart from
    the draw, so it can be held against ``rejection_decide_reference``.

    Arguments as in ``rejection_verify``. Returns (n_accepted, residual_row): an int32 scalar
    and the normalised distribution the next token is drawn from, norm(max(0, p_n - q_n)) at
    the first rejection n or p_K when all K are kept (p_n itself if the residual is empty).
    """
    n_accepted, residual = _residual_decision(draft, q, p, u)
    return n_accepted, residual / residual.sum()


def rejection_verify(
    draft: mx.array, q: mx.array | None, p: mx.array, key: mx.array
) -> tuple[mx.array, mx.array]:
    """Speculative sampling: accept draft[i] with probability min(1, p_i(d_i) / q_i(d_i)).

    draft: int (K,) tokens the drafter proposed. q: (K, V) draft probabilities they were sampled
    from, or None for a deterministic drafter (a point mass on each draft token). p: (K + 1, V)
    target probabilities after temperature / top-k / top-p. key: an ``mx.random.key``.

    Returns (n_accepted, next_token), int32 scalars. At the first rejection n the next token is
    drawn from norm(max(0, p_n - q_n)); if all K are accepted it is a bonus token from p_K.
    The result is a pure function of the inputs and ``key``.
    """
    accept_key, sample_key = mx.random.split(key)
    u = mx.random.uniform(shape=(draft.shape[0],), key=accept_key)
    n_accepted, residual = _residual_decision(draft, q, p, u)
    next_token = mx.random.categorical(mx.log(residual), key=sample_key).astype(mx.int32)
    return n_accepted, next_token


def _block_decision(draft: mx.array, q: mx.array, p: mx.array, eta: mx.array) -> tuple[mx.array, mx.array]:
    """``block_decide`` with the residual row left unnormalised (as ``_residual_decision``).

    The weight of the chain so far, w_0 = 1 and w_i = min(1, w_{i-1} p_{i-1}(d_i) / q_{i-1}(d_i)),
    says how much of the target's mass the kept prefix still carries; the block stops at the
    last i whose uniform falls under h_i = m_i / (m_i + 1 - w_i), m_i = sum_x max(0, w_i p_i(x) -
    q_i(x)) (h_K = w_K), and the next token comes from norm(max(0, w_i p_i - q_i)) there (p_K
    after all K)."""
    draft = draft.astype(mx.int32)
    p, q = p.astype(mx.float32), q.astype(mx.float32)
    num_draft = draft.shape[0]
    p_d = mx.take_along_axis(p[:-1], draft[:, None], axis=-1)[:, 0]
    q_d = mx.take_along_axis(q, draft[:, None], axis=-1)[:, 0]
    # q_d > 0 for a token drawn from q; where it is not, the ratio is 0 (the chain stops there).
    ratio = mx.where(q_d > 0, p_d / mx.maximum(q_d, 1e-30), 0.0)
    weights = [mx.array(1.0)]
    for i in range(num_draft):  # K is small: a short chain of lazy scalar ops
        weights.append(mx.minimum(weights[-1] * ratio[i], 1.0))
    w = mx.stack(weights)  # (K + 1,): w_0 .. w_K
    residual = mx.maximum(w[:num_draft, None] * p[:num_draft] - q, 0.0)  # rows 0 .. K-1
    mass = residual.sum(axis=-1)
    spare = mass + 1.0 - w[:num_draft]
    h = mx.where(spare > MIN_RESIDUAL_MASS, mass / mx.maximum(spare, MIN_RESIDUAL_MASS), 0.0)
    h = mx.concatenate([h[1:], w[num_draft:]])  # h_1 .. h_{K-1}, then h_K = w_K
    stops = mx.where(eta <= h, mx.arange(1, num_draft + 1), 0)
    n_accepted = stops.max().astype(mx.int32)
    rows = mx.concatenate([residual, p[num_draft:]], axis=0)
    row = mx.take(rows, n_accepted, axis=0)
    return n_accepted, mx.where(row.sum() > MIN_RESIDUAL_MASS, row, mx.take(p, n_accepted, axis=0))


def block_decide(draft: mx.array, q: mx.array, p: mx.array, eta: mx.array) -> tuple[mx.array, mx.array]:
    """Block verification's decision for given uniforms ``eta`` (K,), apart from the draw, to
    hold against ``block_decide_reference``. Returns (n_accepted, normalised next-token row)."""
    n_accepted, row = _block_decision(draft, q, p, eta)
    return n_accepted, row / row.sum()


def block_verify(draft: mx.array, q: mx.array, p: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    """Block verification of a chain ``draft`` (K,) sampled from ``q`` (K, V), against ``p``
    (K + 1, V): (n_accepted, next_token), as ``rejection_verify`` returns them, exact in the
    same sense (the emitted text is distributed as sampling the target alone) and keeping at
    least as many drafts on average. A deterministic drafter (q None) has nothing to gain:
    call ``rejection_verify``."""
    accept_key, sample_key = mx.random.split(key)
    eta = mx.random.uniform(shape=(draft.shape[0],), key=accept_key)
    n_accepted, row = _block_decision(draft, q, p, eta)
    return n_accepted, mx.random.categorical(mx.log(row), key=sample_key).astype(mx.int32)


def tree_verify(tokens: mx.array, parents: Sequence[int], choices: mx.array) -> tuple[mx.array, mx.array]:
    """Walk a draft tree along the target's own choices.

    tokens: int (m,) the tree's nodes, ``parents`` as in ``Proposal``. choices: int (m + 1,),
    the target's token at the root (row 0) and after each node (row 1 + i). From the root,
    follow the first child whose token is the target's choice there, until a node has none.

    Returns (last, next_token), int32 scalars: the last node of the accepted path (-1 when
    no draft is kept; the path is ``tree.path_to(parents, last)``) and the target's choice
    after it. Every emitted token is the target's choice at its own node, so with choices drawn
    from the target's p the output is distributed as the target's (the rule for deterministic
    children, e.g. top-B); with argmax choices it is the longest path the target agrees with
    (siblings are distinct in every tree our drafters make). Lazy, like the chain rules.
    """
    m = len(parents)
    if m == 0:
        return mx.array(-1, mx.int32), choices[0].astype(mx.int32)
    tokens, choices = tokens.astype(mx.int32), choices.astype(mx.int32)
    par = np.asarray(parents)
    matches = tokens == mx.take(choices, mx.array(par + 1))
    # Only the first of equal siblings may be followed: the walk must not look ahead.
    earlier_sibling = mx.array((par[:, None] == par[None, :]) & np.tri(m, k=-1, dtype=bool))
    duplicate = ((tokens[:, None] == tokens[None, :]) & earlier_sibling).any(axis=1)
    followed = matches & ~duplicate
    # On the path: the node and all its ancestors followed. Those nodes form one chain from
    # the root, and children come after parents, so its last node has the largest index.
    on_path = ~(mx.array(ancestry(parents)) & ~followed[None, :]).any(axis=1)
    last = mx.max(mx.where(on_path, mx.arange(m), -1)).astype(mx.int32)
    return last, mx.take(choices, last + 1)


def tree_greedy_verify(tokens: mx.array, parents: Sequence[int], target_logits: mx.array) -> tuple[mx.array, mx.array]:
    """``tree_verify`` along the target's argmax: target_logits (m + 1, V) rows of [y, nodes]."""
    return tree_verify(tokens, parents, mx.argmax(target_logits, axis=-1))


def tree_sample_verify(tokens: mx.array, parents: Sequence[int], p: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    """``tree_verify`` along one sample of the target's p (m + 1, V) at every node (rows
    independent). Exact for children the drafter chose deterministically (q is not needed):
    at each node the next token is a draw from p there, whichever children exist."""
    return tree_verify(tokens, parents, mx.random.categorical(mx.log(p.astype(mx.float32)), key=key))


def _accepts(p_d: mx.array, q_d: mx.array, u: mx.array) -> mx.array:
    """The chain rule's accept test, u < p/q without a division (see ``_residual_decision``)."""
    return mx.where(p_d >= q_d, p_d > 0, u * q_d < p_d)


def tree_residual_decide(tokens: mx.array, parents: Sequence[int], q: mx.array, p: mx.array,
                         u: mx.array) -> tuple[mx.array, mx.array]:
    """The multi-round rejection walk of a tree with sampled children, for given uniforms
    ``u`` (m,) (one per node's accept test), apart from the final draw.

    tokens: int (m,). q: (m, V), row i the draft distribution node i was sampled from (its
    parent's; siblings share it). p: (m + 1, V) the target's rows for [root, nodes].
    Returns (last, residual): the last node of the accepted path (-1: none) and the normalised
    distribution of the token after it (the residual left by its rejected children, or p
    there if all of them were rejected into an empty residual, or it has none).
    Each node is decided on its own (its test only reads its own row), then the path is the
    chain of accepted children from the root, so the graph is static for a given tree."""
    m = len(parents)
    tokens, p = tokens.astype(mx.int32), p.astype(mx.float32)
    if m == 0:
        return mx.array(-1, mx.int32), p[0] / p[0].sum()
    q = q.astype(mx.float32)
    kids = children(parents)
    chosen, residuals = [], []
    for row in range(m + 1):  # row 0: the root, row 1 + i: node i
        p_cur, pick = p[row], mx.array(-1, mx.int32)
        for c in kids.get(row - 1, []):
            t = tokens[c]
            pick = mx.where((pick < 0) & _accepts(p_cur[t], q[c, t], u[c]), c, pick)
            rest = mx.maximum(p_cur - q[c], 0.0)
            mass = rest.sum()
            p_cur = mx.where(mass > MIN_RESIDUAL_MASS, rest / mass, p_cur)
        chosen.append(pick)
        residuals.append(p_cur / p_cur.sum())
    step = mx.stack(chosen)
    last = mx.array(-1, mx.int32)
    for _ in range(max(depths(parents))):
        nxt = mx.take(step, last + 1)
        last = mx.where(nxt >= 0, nxt, last)
    return last, mx.take(mx.stack(residuals), last + 1, axis=0)


def tree_residual_verify(tokens: mx.array, parents: Sequence[int], q: mx.array, p: mx.array,
                         key: mx.array) -> tuple[mx.array, mx.array]:
    """``tree_residual_decide`` with its uniforms and the final draw from ``key``: returns
    (last, next_token) as ``tree_verify``."""
    accept_key, sample_key = mx.random.split(key)
    last, residual = tree_residual_decide(tokens, parents, q, p, mx.random.uniform(shape=(len(parents),), key=accept_key))
    return last, mx.random.categorical(mx.log(residual), key=sample_key).astype(mx.int32)


def rejection_output_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact float64 distribution of the token emitted at one position by speculative sampling.

    The draft token is sampled from q and kept with probability min(1, p/q); on rejection a
    token is drawn from norm(max(0, p - q)). Theory says the result is p.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    kept = np.minimum(p, q)  # q(d) * min(1, p(d)/q(d)), with 0 where q(d) == 0
    reject_prob = np.maximum(q - p, 0.0).sum()  # = 1 - sum(min(p, q)) when q sums to 1
    residual = np.maximum(p - q, 0.0)
    mass = residual.sum()
    # Mirror rejection_verify: an empty residual falls back to p (then reject_prob is 0 anyway).
    rejected = residual / mass if mass > 0 else p
    return kept + reject_prob * rejected


def rejection_decide_reference(
    draft: Sequence[int] | np.ndarray, q: np.ndarray | None, p: np.ndarray, u: Sequence[float] | np.ndarray
) -> tuple[int, np.ndarray]:
    """``rejection_decide`` in numpy float64, one position at a time, as the rule is written:
    keep draft i when u_i * q_i(d_i) < p_i(d_i) (always when p >= q, unless p(d_i) == 0),
    then the normalised residual at the first rejection, p_K after K kept, p_n if empty."""
    draft = np.asarray(draft, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    num_draft, vocab = len(draft), p.shape[-1]
    q = np.eye(vocab)[draft] if q is None else np.asarray(q, dtype=np.float64)
    n = 0
    while n < num_draft:
        p_d, q_d = p[n, draft[n]], q[n, draft[n]]
        if not (p_d > 0 if p_d >= q_d else u[n] * q_d < p_d):
            break
        n += 1
    q_row = q[n] if n < num_draft else np.zeros(vocab)
    residual = np.maximum(p[n] - q_row, 0.0)
    if not residual.sum() > MIN_RESIDUAL_MASS:
        residual = p[n]
    return n, residual / residual.sum()


def _block_reference(draft: np.ndarray, q: np.ndarray, p: np.ndarray) -> tuple[list[float], list[float]]:
    """Block verification's weights w_0..w_K and stop thresholds h_0..h_K (h_0 unused), float64."""
    k = len(draft)
    w = [1.0]
    for i in range(k):
        w.append(min(1.0, w[-1] * p[i, draft[i]] / q[i, draft[i]]) if q[i, draft[i]] > 0 else 0.0)
    h = [0.0] * (k + 1)
    for i in range(1, k):
        mass = np.maximum(w[i] * p[i] - q[i], 0.0).sum()
        spare = mass + 1.0 - w[i]
        h[i] = mass / spare if spare > MIN_RESIDUAL_MASS else 0.0
    h[k] = w[k]
    return w, h


def block_decide_reference(draft: Sequence[int], q: np.ndarray, p: np.ndarray, eta: Sequence[float]
                           ) -> tuple[int, np.ndarray]:
    """``block_decide`` in numpy float64, as the rule is written (``_block_decision``)."""
    draft, p, q = np.asarray(draft), np.asarray(p, np.float64), np.asarray(q, np.float64)
    k = len(draft)
    w, h = _block_reference(draft, q, p)
    n = max([i for i in range(1, k + 1) if eta[i - 1] <= h[i]], default=0)
    row = p[k] if n == k else np.maximum(w[n] * p[n] - q[n], 0.0)
    if not row.sum() > MIN_RESIDUAL_MASS:
        row = p[n]
    return n, row / row.sum()


def block_stop_probabilities(draft: Sequence[int], q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """P(block verification keeps exactly n drafts), n = 0..K, over its independent uniforms:
    the last i with eta_i <= h_i."""
    draft, p, q = np.asarray(draft), np.asarray(p, np.float64), np.asarray(q, np.float64)
    k = len(draft)
    _, h = _block_reference(draft, q, p)
    out, later = np.zeros(k + 1), 1.0  # later: P(no stop after i)
    for i in range(k, 0, -1):
        out[i] = later * h[i]
        later *= 1.0 - h[i]
    out[0] = later
    return out


def tree_output_distribution(tokens: Sequence[int], parents: Sequence[int], p: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact float64 distribution of what one ``tree_verify`` step emits (the accepted path's
    tokens, then the target's token after it) when every row's choice is drawn from p
    (m + 1, V). Theory says each sequence gets the product of p along it: the target's own
    probability of emitting it."""
    p = np.asarray(p, dtype=np.float64)
    kids: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        kids.setdefault(par, {}).setdefault(int(tok), i)  # the first of equal siblings
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, emitted: tuple[int, ...], weight: float) -> None:
        for v in np.flatnonzero(p[node + 1] > 0):
            w = weight * p[node + 1, v]
            child = kids.get(node, {}).get(int(v))
            if child is None:
                out[emitted + (int(v),)] = out.get(emitted + (int(v),), 0.0) + w
            else:
                walk(child, emitted + (int(v),), w)

    walk(-1, (), 1.0)
    return out


def tree_residual_decide_reference(tokens: Sequence[int], parents: Sequence[int], q: np.ndarray, p: np.ndarray,
                                   u: Sequence[float] | np.ndarray) -> tuple[int, np.ndarray]:
    """``tree_residual_decide`` in numpy float64, walked as the rule is written: from the
    root, try each child in order, keep it when u q(t) < p'(t) (always when p' >= q, unless
    p'(t) == 0), else p' <- norm(max(0, p' - q)); descend into the first kept child."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    kids = children(parents)
    node = -1
    while True:
        p_cur = p[node + 1]
        for c in kids.get(node, []):
            t = int(tokens[c])
            if (p_cur[t] > 0 if p_cur[t] >= q[c, t] else u[c] * q[c, t] < p_cur[t]):
                node = c
                break
            rest = np.maximum(p_cur - q[c], 0.0)
            if rest.sum() > MIN_RESIDUAL_MASS:
                p_cur = rest / rest.sum()
        else:
            return node, p_cur / p_cur.sum()


def tree_residual_output_distribution(tokens: Sequence[int], parents: Sequence[int], q: np.ndarray,
                                      p: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact float64 distribution of what one ``tree_residual_verify`` step emits for a given
    tree (the uniforms integrated out: child c is kept with probability min(1, p'(t)/q(t)))."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    kids = children(parents)
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, emitted: tuple[int, ...], weight: float) -> None:
        p_cur, reach = p[node + 1], weight
        for c in kids.get(node, []):
            t = int(tokens[c])
            keep = (1.0 if p_cur[t] > 0 else 0.0) if p_cur[t] >= q[c, t] else p_cur[t] / q[c, t]
            if keep > 0:
                walk(c, emitted + (t,), reach * keep)
            reach *= 1.0 - keep
            rest = np.maximum(p_cur - q[c], 0.0)
            if rest.sum() > MIN_RESIDUAL_MASS:
                p_cur = rest / rest.sum()
        for v in np.flatnonzero(p_cur > 0):
            out[emitted + (int(v),)] = out.get(emitted + (int(v),), 0.0) + reach * p_cur[v] / p_cur.sum()

    walk(-1, (), 1.0)
    return out


def expected_accept_rate(
    p: np.ndarray | mx.array, q: np.ndarray | mx.array
) -> float | np.ndarray | mx.array:
    """Per-position acceptance probability of rejection sampling: sum_v min(p_v, q_v)."""
    if isinstance(p, mx.array) or isinstance(q, mx.array):
        return mx.minimum(mx.array(p), mx.array(q)).sum(axis=-1)
    return np.minimum(np.asarray(p), np.asarray(q)).sum(axis=-1)


def token_match_rate(
    p: np.ndarray | mx.array, q: np.ndarray | mx.array
) -> float | np.ndarray | mx.array:
    """Acceptance probability of naive "sample both, compare tokens": sum_v p_v q_v."""
    if isinstance(p, mx.array) or isinstance(q, mx.array):
        return (mx.array(p) * mx.array(q)).sum(axis=-1)
    return (np.asarray(p) * np.asarray(q)).sum(axis=-1)


def pad_vocab(q: mx.array | None, vocab: int) -> mx.array | None:
    """Draft and target may pad their embedding tables differently; tokens beyond the
    smaller table have probability 0 there."""
    if q is None or q.shape[-1] == vocab:
        return q
    if q.shape[-1] > vocab:
        return q[:, :vocab]
    return mx.concatenate([q, mx.zeros((q.shape[0], vocab - q.shape[-1]), q.dtype)], axis=-1)
