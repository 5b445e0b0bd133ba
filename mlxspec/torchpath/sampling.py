"""Logits -> the distribution a model samples from, in torch (mirror of ``mlxspec.core.sampling``).

The filters reproduce mlx-lm's ``apply_top_k``, ``apply_top_p`` and ``apply_min_p`` token for
token, so the MLX and torch paths sample from the same support: speculative sampling is exact
only if draft and target use the processed distributions. Ties at the top-k boundary keep the
lowest token ids, as MLX's argpartition does on CPU. Math is float32, or float64 for float64
logits.

A key on this path is a plain int seed (0 <= key < 2**63); every random draw comes from
``torch.Generator(device=...).manual_seed(key)``, so a result is a pure function of its inputs
and the key on a given device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mlxspec.core.sampling import CoupledKey, SamplingParams, position_seed

_KEY_BOUND = 2**63


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def generator(key: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator every draw keyed by ``key`` comes from."""
    return torch.Generator(device=device).manual_seed(key)


def split_key(key: int, n: int) -> list[int]:
    """``n`` independent keys derived from ``key``, the same on every device (drawn on CPU),
    so one seed can drive several draws without reusing a stream."""
    g = torch.Generator().manual_seed(key)
    return torch.randint(0, _KEY_BOUND - 1, (n,), generator=g).tolist()


def _apply_top_k(lp: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep exactly ``top_k`` tokens; a stable sort keeps the lowest ids among ties, which is
    what MLX's argpartition does."""
    order = torch.sort(lp, dim=-1, descending=True, stable=True).indices
    return lp.scatter(-1, order[..., top_k:], float("-inf"))


def _apply_top_p(lp: torch.Tensor, top_p: float) -> torch.Tensor:
    """mlx-lm's nucleus rule: drop the smallest tokens while the mass above them is at least
    ``top_p`` of the total, then keep everything tied with the smallest survivor."""
    sorted_lp = torch.sort(lp, dim=-1).values
    sorted_probs = torch.exp(sorted_lp)
    tail = torch.flip(torch.cumsum(torch.flip(sorted_probs[..., 1:], (-1,)), dim=-1), (-1,))
    mass_above = torch.cat([tail, torch.zeros_like(sorted_probs[..., :1])], dim=-1)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(dim=-1, keepdim=True)
    threshold = sorted_lp.gather(-1, num_dropped.clamp_max(lp.shape[-1] - 1))
    return lp.masked_fill(lp < threshold, float("-inf"))


def _min_p_keeps(lp: torch.Tensor, min_p: float) -> torch.Tensor:
    """The tokens at least ``min_p`` times as likely as the most likely one. On a row the other
    filters left, the same: they never drop its most likely token."""
    return lp >= lp.amax(dim=-1, keepdim=True) + math.log(min_p)


def _filtered(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The normalised log-probabilities before the filters, and the entries the filters keep
    (None: no filter on, every entry kept)."""
    lp = logits.to(_work_dtype(logits))
    if not params.greedy:
        lp = lp / params.temperature
    lp = lp - torch.logsumexp(lp, dim=-1, keepdim=True)
    if params.greedy:
        return lp, None
    kept = lp
    if 0 < params.top_k < lp.shape[-1]:
        kept = _apply_top_k(kept, params.top_k)
    if params.top_p < 1:
        kept = _apply_top_p(kept, params.top_p)
    keep = None if kept is lp else kept > float("-inf")
    if params.min_p > 0:
        above = _min_p_keeps(lp, params.min_p)
        keep = above if keep is None else keep & above
    return lp, keep


def _kept_weights(lp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(lp) where kept, 0 elsewhere, in place on one new row. The filters' -inf entries are
    never exponentiated (an exp of -inf takes torch's slow path here, and a min-p row is nearly
    all -inf), and each full-width temporary costs its allocation: ~0.35 ms a sampled step at
    the chat's min-p 0.1 went to these before."""
    return torch.exp(lp).mul_(keep)


def logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Normalised log-probabilities of the processed distribution, shape of logits."""
    lp, keep = _filtered(logits, params)
    if keep is None:
        return lp
    mass = _kept_weights(lp, keep).sum(dim=-1, keepdim=True)
    return (lp - torch.log(mass)).masked_fill_(~keep, float("-inf"))


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    lp, keep = _filtered(logits, params)
    if keep is None:
        return torch.exp(lp)
    weights = _kept_weights(lp, keep)
    return weights.div_(weights.sum(dim=-1, keepdim=True))


def coupled_scores(logits: torch.Tensor, params: SamplingParams, seed: int, positions: Sequence[int]) -> torch.Tensor:
    """``core.sampling.coupled_scores``: the noise from torch's generator at the same
    (seed, position) seeds (not MLX's numbers: each backend reproduces its own replies)."""
    lp = logprobs(logits, params)
    tiny = torch.finfo(lp.dtype).tiny
    noise = [-torch.log(-torch.log(torch.rand(lp.shape[-1], generator=generator(position_seed(seed, p) % _KEY_BOUND),
                                              dtype=lp.dtype).clamp_min(tiny))) for p in positions]
    return lp + torch.stack(noise).to(lp.device)


def categorical(logp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of (unnormalised) log-probabilities, int32: ``draw`` on their weights.
    One uniform a row instead of Gumbel noise over the vocabulary: 0.17 against 0.31 ms a
    49k-token row here. It takes any leading shape, stays on the device and never picks a -inf
    entry."""
    return draw(torch.exp(logp - logp.amax(dim=-1, keepdim=True)), gen)


def draw(weights: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of non-negative (unnormalised) weights, int32: the row's cumulative
    weights (float64 but on MPS) inverted at one uniform. The point is kept below the row's
    total, so the first cumulative weight above it belongs to an entry of positive weight. A
    row that is already weights (a residual, a filtered p) is drawn from as it is: its log and
    exp again cost ~0.3 ms a 49k-token row with zeros in it (a log of 0, an exp of -inf or of an
    underflow each take torch's slow path here)."""
    wide = torch.float32 if weights.device.type == "mps" else torch.float64  # MPS has no float64
    cdf = torch.cumsum(weights.to(wide), dim=-1)
    total = cdf[..., -1:]
    u = torch.rand(total.shape, generator=gen, dtype=wide, device=weights.device)
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True).squeeze(-1).to(torch.int32)


def sample(logits: torch.Tensor, params: SamplingParams, key: int | CoupledKey | None) -> torch.Tensor:
    """One token per row of ``logits`` (int32), argmax when greedy (``key`` unused then); with a
    ``CoupledKey`` as ``core.sampling.sample``."""
    if params.greedy:
        return torch.argmax(logits, dim=-1).to(torch.int32)
    if isinstance(key, CoupledKey):
        rows = logits.reshape(-1, logits.shape[-1])
        scores = coupled_scores(rows, params, key.seed, range(key.position, key.position + rows.shape[0]))
        return torch.argmax(scores, dim=-1).to(torch.int32).reshape(logits.shape[:-1])
    if key is None:
        raise ValueError("sampling at temperature > 0 needs a key")
    return draw(probs(logits, params), generator(key, logits.device))  # weights: no log and exp again
