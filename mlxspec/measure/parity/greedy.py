"""Parity of greedy decoding: target-only and each drafter at each K on both backends, token
for token. At the first divergence both backends run the common prefix in one fresh pass; it is
a near-tie when the MLX logits of the two tokens are closer than the tolerance lets each move
(``2 * tolerance * max |logit|``), else a mismatch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.parity.logits import mlx_logits, torch_logits
from mlxspec.measure.parity.records import Divergence, GreedyRow
from mlxspec.measure.runs import engine_run, first_mismatch
from mlxspec.targets.drafts import make_drafter


def divergence(lm, tl, prompt: Any, ids: list[int], a: list[int], b: list[int], tol: float) -> Divergence | None:
    """None when ``a`` (MLX) == ``b`` (torch), else the first divergence, classified."""
    at = first_mismatch(a, b)
    if at is None:
        return None
    if at == min(len(a), len(b)):
        return Divergence(prompt, at, None, None, "", "", None, None, None, False,
                          reason=f"lengths differ: MLX {len(a)}, torch {len(b)}")
    prefix, ta, tb = ids + a[:at], a[at], b[at]
    la, lb = mlx_logits(lm.model, prefix), torch_logits(tl.model, prefix)
    allowed = 2 * tol * float(np.abs(la).max())
    dec = lm.tokenizer.decode
    return Divergence(prompt, at, ta, tb, dec([ta]), dec([tb]), (float(la[ta]), float(la[tb])),
                      (float(lb[ta]), float(lb[tb])), allowed, bool(abs(float(la[ta] - la[tb])) <= allowed))


def ks_of(draft: str, ks: Sequence[int]) -> list[int | None]:
    """The Ks a drafter runs at: None alone for target-only ("none")."""
    return [None] if draft in ("none", "") else list(ks)


def drafter_pairs(lm, tl, drafters: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """Each drafter spec made for both backends, (MLX, torch); None for "none". Made before any
    work, so a bad spec is refused at once."""
    return {d: (make_drafter(d, lm, lm.dtype), make_drafter(d, tl, tl.dtype)) for d in dict.fromkeys(drafters)}


@dataclass(frozen=True)
class _Compare:
    """Both backends and the prompts ((key, ids) each) every method is compared on."""

    lm: Any
    tl: Any
    prompts: Sequence[tuple[Any, list[int]]]
    max_tokens: int
    tol: float
    tick: Callable[[str], None]

    def row(self, draft: str, pair: tuple[Any, Any], k: int | None) -> GreedyRow:
        """One method (``draft`` at ``k``) over every prompt, on both backends."""
        lm, tl, prompts, tick = self.lm, self.tl, self.prompts, self.tick
        params = SamplingParams()
        divs, same_steps, compared, agreeing = [], 0, 0, 0
        acc = {"mlx": [], "torch": []}
        for key, ids in prompts:
            n = min(self.max_tokens, lm.context_length - len(ids) - 1)
            runs = {}
            for name, model, d in (("mlx", lm, pair[0]), ("torch", tl, pair[1])):
                runs[name] = engine_run(model, ids, params, n, set(), 0, d, k or 1)
                acc[name] += runs[name].accepted
                tick(f"greedy {name} {'target-only' if k is None else f'{draft} K={k}'} · {key}")
            a, b = runs["mlx"].tokens, runs["torch"].tokens
            compared += len(a)
            at = first_mismatch(a, b)
            agreeing += len(a) if at is None else at
            same_steps += runs["mlx"].accepted == runs["torch"].accepted
            div = divergence(lm, tl, key, ids, a, b, self.tol)
            if div is not None:
                divs.append(div)
        tau = {name: (sum(v) / len(v) if v and k is not None else None) for name, v in acc.items()}
        near = sum(d.near_tie for d in divs)
        return GreedyRow(draft, k, len(prompts), len(prompts) - len(divs), near, len(divs) - near,
                         compared, agreeing, same_steps, tau["mlx"], tau["torch"], divs)


def greedy_agreement(lm, tl, prompts: Sequence[tuple[Any, list[int]]], pairs: dict[str, tuple[Any, Any]],
                     ks: Sequence[int], max_tokens: int, tol: float,
                     tick: Callable[[str], None] = lambda _: None) -> list[GreedyRow]:
    """Greedy outputs of both backends for target-only (draft "none") and each drafter of
    ``pairs`` (``drafter_pairs``) at each K, prompt by prompt ((key, ids) each), compared
    token for token."""
    compare = _Compare(lm, tl, prompts, max_tokens, tol, tick)
    return [compare.row(draft, pair, k) for draft, pair in pairs.items() for k in ks_of(draft, ks)]
