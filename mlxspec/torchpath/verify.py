"""Acceptance rules for speculative decoding in torch (mirror of ``mlxspec.core.verify``).

Same arguments and results as the MLX rules (0-d int32 tensors), and no host syncs, so the
engine can keep a whole step on the device. Rejection sampling is split in two: a pure
decision given the uniforms (``rejection_decide``), which the tests hold against the numpy
float64 reference, and the draw (``rejection_verify``). Float64 inputs stay float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mlxspec.core.tree import ancestry, children, depths
from mlxspec.core.verify import MIN_RESIDUAL_MASS
from mlxspec.torchpath.sampling import categorical, draw, generator


def _work_dtype(*xs: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(x is not None and x.dtype == torch.float64 for x in xs) else torch.float32


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Number of leading True entries of a 1-D boolean tensor, as an int32 scalar."""
    return torch.cumprod(mask.to(torch.int32), dim=0).sum().to(torch.int32)


def _at(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``x[i]`` for a 0-d index tensor without reading it on the host."""
    return x.index_select(0, i.reshape(1)).reshape(x.shape[1:])


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the longest prefix of ``draft`` (K,) that agrees with the argmax of
    ``target_logits`` (K + 1, V); (n_accepted, next_token) as in the MLX rule."""
    target_tokens = torch.argmax(target_logits, dim=-1).to(torch.int32)
    n_accepted = _leading_true(draft.to(torch.int32) == target_tokens[:-1])
    return n_accepted, _at(target_tokens, n_accepted)


def rejection_decide(
    draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The speculative-sampling decision for given uniforms ``u`` (K,) in [0, 1).

    draft (K,), q (K, V) or None (a point mass on each draft token), p (K + 1, V), as in
    ``rejection_verify``. Draft i is kept when u_i * q_i(d_i) < p_i(d_i), always when
    p >= q there unless p(d_i) == 0. Returns (n_accepted, residual_row): an int32 scalar and
    the normalised distribution the next token is drawn from, norm(max(0, p_n - q_n)) at the
    first rejection n or p_K when all are kept, p_n itself when the residual is empty.
    """
    dtype = _work_dtype(p, q)
    draft = draft.to(torch.int64)
    p = p.to(dtype)
    num_draft, vocab = draft.shape[0], p.shape[-1]

    p_draft = p[:-1].gather(-1, draft[:, None])[:, 0]
    if q is None:  # point masses: the residual is p's row less its draft token, no (K, V) one-hot
        accepted = torch.where(p_draft >= 1.0, p_draft > 0, u.to(dtype) < p_draft)
        n_accepted = _leading_true(accepted)
        p_row = _at(p, n_accepted)
        at = _at(torch.cat([draft, draft.new_zeros(1)]), n_accepted).reshape(1)  # token 0 when all kept: unchanged
        mass = p_row.index_select(0, at)
        residual = p_row.index_copy(0, at, torch.where(n_accepted < num_draft, torch.clamp_min(mass - 1.0, 0.0), mass))
    else:
        q = q.to(dtype)
        q_draft = q.gather(-1, draft[:, None])[:, 0]
        accepted = torch.where(p_draft >= q_draft, p_draft > 0, u.to(dtype) * q_draft < p_draft)
        n_accepted = _leading_true(accepted)
        q = torch.cat([q, q.new_zeros((1, vocab))], dim=0)
        p_row, q_row = _at(p, n_accepted), _at(q, n_accepted)
        residual = torch.clamp_min(p_row - q_row, 0.0)
    residual = torch.where(residual.sum() > MIN_RESIDUAL_MASS, residual, p_row)
    return n_accepted, residual / residual.sum()


def rejection_verify(
    draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, key: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. / Chen et al.), distributed exactly as sampling
    p alone. The uniforms and then the next token come from one generator seeded by ``key``,
    so (n_accepted, next_token) is a pure function of the inputs and the key."""
    gen = generator(key, p.device)
    if draft.shape[0] == 0:  # a step that drafted nothing: p's own draw, no residual to build
        return torch.zeros((), dtype=torch.int32, device=p.device), draw(p[0], gen)
    u = torch.rand(draft.shape[0], generator=gen, dtype=_work_dtype(p, q), device=p.device)
    n_accepted, residual_row = rejection_decide(draft, q, p, u)
    return n_accepted, draw(residual_row, gen)


def block_decide(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, eta: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's decision for given uniforms ``eta`` (K,), as the MLX rule
    (``core.verify._block_decision``): (n_accepted, normalised next-token row)."""
    dtype = _work_dtype(p, q)
    draft, p, q = draft.to(torch.int64), p.to(dtype), q.to(dtype)
    num_draft = draft.shape[0]
    p_d = p[:-1].gather(-1, draft[:, None])[:, 0]
    q_d = q.gather(-1, draft[:, None])[:, 0]
    ratio = torch.where(q_d > 0, p_d / q_d.clamp_min(1e-30), torch.zeros_like(p_d))
    weights = [torch.ones((), dtype=dtype, device=p.device)]
    for i in range(num_draft):
        weights.append(torch.clamp_max(weights[-1] * ratio[i], 1.0))
    w = torch.stack(weights)
    residual = torch.clamp_min(w[:num_draft, None] * p[:num_draft] - q, 0.0)
    mass = residual.sum(-1)
    spare = mass + 1.0 - w[:num_draft]
    h = torch.where(spare > MIN_RESIDUAL_MASS, mass / spare.clamp_min(MIN_RESIDUAL_MASS), torch.zeros_like(mass))
    h = torch.cat([h[1:], w[num_draft:]])
    steps = torch.arange(1, num_draft + 1, device=p.device)
    n_accepted = torch.where(eta.to(dtype) <= h, steps, torch.zeros_like(steps)).max().to(torch.int32)
    row = _at(torch.cat([residual, p[num_draft:]], dim=0), n_accepted)
    row = torch.where(row.sum() > MIN_RESIDUAL_MASS, row, _at(p, n_accepted))
    return n_accepted, row / row.sum()


def block_verify(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of a sampled chain (``core.verify.block_verify``); the uniforms and
    the next token from one generator seeded by ``key``."""
    gen = generator(key, p.device)
    eta = torch.rand(draft.shape[0], generator=gen, dtype=_work_dtype(p, q), device=p.device)
    n_accepted, row = block_decide(draft, q, p, eta)
    return n_accepted, draw(row, gen)


def tree_verify(
    tokens: torch.Tensor, parents: Sequence[int], choices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk a draft tree along the target's choices (m + 1,): from the root follow the first
    child whose token is the choice there. Returns (last, next_token) as the MLX rule does."""
    m = len(parents)
    device = choices.device
    choices = choices.to(torch.int32)
    if m == 0:
        return torch.tensor(-1, dtype=torch.int32, device=device), choices[0]
    tokens = tokens.to(torch.int32)
    par = np.asarray(parents)
    matches = tokens == choices.index_select(0, torch.as_tensor(par + 1, device=device))
    # Only the first of equal siblings may be followed: the walk must not look ahead.
    earlier_sibling = torch.as_tensor((par[:, None] == par[None, :]) & np.tri(m, k=-1, dtype=bool), device=device)
    duplicate = ((tokens[:, None] == tokens[None, :]) & earlier_sibling).any(dim=1)
    followed = matches & ~duplicate
    # The path's nodes form one chain from the root and children come after parents, so
    # its last node has the largest index.
    on_path = ~(torch.as_tensor(ancestry(parents), device=device) & ~followed[None, :]).any(dim=1)
    index = torch.arange(m, dtype=torch.int32, device=device)
    last = torch.where(on_path, index, torch.full_like(index, -1)).max()
    return last, _at(choices, last + 1)


def tree_greedy_verify(
    tokens: torch.Tensor, parents: Sequence[int], target_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tree_verify`` along the target's argmax: target_logits (m + 1, V) rows of [y, nodes]."""
    return tree_verify(tokens, parents, torch.argmax(target_logits, dim=-1))


def tree_sample_verify(
    tokens: torch.Tensor, parents: Sequence[int], p: torch.Tensor, key: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tree_verify`` along one independent sample of the target's p (m + 1, V) per row."""
    logp = torch.log(p.to(_work_dtype(p)))
    return tree_verify(tokens, parents, categorical(logp, generator(key, p.device)))


def tree_residual_decide(
    tokens: torch.Tensor, parents: Sequence[int], q: torch.Tensor, p: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``core.verify.tree_residual_decide``: the multi-round rejection walk of a tree whose
    children were sampled from q (m, V), target rows p (m + 1, V), uniforms u (m,)."""
    m, device, dtype = len(parents), p.device, _work_dtype(p, q)
    p = p.to(dtype)
    if m == 0:
        return torch.tensor(-1, dtype=torch.int32, device=device), p[0] / p[0].sum()
    tokens, q, u = tokens.to(torch.int64), q.to(dtype), u.to(dtype)
    kids = children(parents)
    none = torch.tensor(-1, dtype=torch.int32, device=device)
    chosen, residuals = [], []
    for row in range(m + 1):  # row 0: the root, row 1 + i: node i
        p_cur, pick = p[row], none
        for c in kids.get(row - 1, []):
            p_d, q_d = _at(p_cur, tokens[c]), _at(q[c], tokens[c])
            ok = torch.where(p_d >= q_d, p_d > 0, u[c] * q_d < p_d)
            pick = torch.where((pick < 0) & ok, torch.tensor(c, dtype=torch.int32, device=device), pick)
            rest = torch.clamp_min(p_cur - q[c], 0.0)
            mass = rest.sum()
            p_cur = torch.where(mass > MIN_RESIDUAL_MASS, rest / mass.clamp_min(MIN_RESIDUAL_MASS), p_cur)
        chosen.append(pick)
        residuals.append(p_cur / p_cur.sum())
    step, last = torch.stack(chosen), none
    for _ in range(max(depths(parents))):
        nxt = _at(step, last + 1)
        last = torch.where(nxt >= 0, nxt, last)
    return last, _at(torch.stack(residuals), last + 1)


def tree_residual_verify(
    tokens: torch.Tensor, parents: Sequence[int], q: torch.Tensor, p: torch.Tensor, key: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tree_residual_decide`` with its uniforms and the final draw from one generator seeded
    by ``key``: (last, next_token) as ``tree_verify``."""
    gen = generator(key, p.device)
    u = torch.rand(len(parents), generator=gen, dtype=_work_dtype(p, q), device=p.device)
    last, residual = tree_residual_decide(tokens, parents, q, p, u)
    return last, draw(residual, gen)


def pad_vocab(q: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """Draft and target may pad their embedding tables differently; tokens beyond the
    smaller table have probability 0 there."""
    if q is None or q.shape[-1] == vocab:
        return q
    if q.shape[-1] > vocab:
        return q[:, :vocab]
    return torch.cat([q, q.new_zeros((q.shape[0], vocab - q.shape[-1]))], dim=-1)
