"""Parity of the speculative-sampling decision: one verify step per prompt, decided by both
backends' ``rejection_decide`` from their own logits of the same sequence under the same
uniforms. q is a stand-in drafter, the target's own distribution at ``DECISION_Q_TEMP`` (close
to p but not equal, so the keep probabilities min(1, p/q) spread over (0, 1]); p is the target
at T=1. A disagreement is explained when its uniform lies between the two backends' keep
probabilities, which the logit difference allows. torch is imported where it is used."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from mlxspec.core import sampling as mlx_sampling
from mlxspec.core import verify as mlx_verify
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.parity.logits import np_mlx, np_torch, torch_tokens
from mlxspec.measure.parity.records import DECISION_Q_TEMP, DecisionRow

P_PARAMS, Q_PARAMS = SamplingParams(1.0), SamplingParams(DECISION_Q_TEMP)


def draft_chain(lm, ids: list[int], k: int, q_params, rng: np.random.Generator) -> list[int]:
    """K draft tokens sampled one after another from the stand-in drafter's q (the MLX
    target's distribution under ``q_params``), each after the prompt and the drafts before it."""
    model, cache, draft = lm.model, lm.model.make_cache(), []
    x = mx.array([ids], mx.int32)
    for _ in range(k):
        q = np_mlx(mlx_sampling.probs(model(x, cache)[0, -1], q_params)).astype(np.float64)
        draft.append(int(rng.choice(q.size, p=q / q.sum())))
        x = mx.array([draft[-1:]], mx.int32)
    return draft


def _distributions(lm, tl, ids: list[int], draft: list[int]) -> tuple[Any, Any, Any, Any]:
    """(p, q) on MLX, then (p, q) on torch: p over the K+1 verify rows, q over the K drafts,
    each backend from its own pass over the prompt and the drafts."""
    import torch

    from mlxspec.torchpath import sampling as torch_sampling

    k, seq, n0 = len(draft), ids + draft, len(ids)
    logits = lm.model(mx.array([seq], mx.int32), lm.model.make_cache())[0, n0 - 1:]
    pm, qm = mlx_sampling.probs(logits, P_PARAMS), mlx_sampling.probs(logits[:k], Q_PARAMS)
    mx.eval(pm, qm)
    with torch.inference_mode():
        logits = tl.model(torch_tokens(seq, tl.model.device), tl.model.make_cache())[0, n0 - 1:]
        pt, qt = torch_sampling.probs(logits, P_PARAMS), torch_sampling.probs(logits[:k], Q_PARAMS)
    return pm, qm, pt, qt


def _keep(draft: list[int], dists: tuple[Any, Any, Any, Any]) -> dict[str, np.ndarray]:
    """The probability of keeping each draft, min(1, p/q), on each backend (float64)."""
    pm, qm, pt, qt = dists
    idx, d_np = np.arange(len(draft)), np.asarray(draft, np.int64)
    keep = {}
    for name, p, q in (("mlx", np_mlx(pm), np_mlx(qm)), ("torch", np_torch(pt), np_torch(qt))):
        pd, qd = p[idx, d_np].astype(np.float64), q[idx, d_np].astype(np.float64)
        keep[name] = np.minimum(1.0, pd / np.maximum(qd, np.finfo(np.float64).tiny))
    return keep


def _decide(key: Any, draft: list[int], dists: tuple[Any, Any, Any, Any], uniforms: np.ndarray,
            device: Any) -> DecisionRow:
    """Both backends' decisions under each row of ``uniforms`` (draws, K), tallied."""
    import torch

    from mlxspec.torchpath import verify as torch_verify

    pm, qm, pt, qt = dists
    keep = _keep(draft, dists)
    dm, dt = mx.array(draft, mx.int32), torch.tensor(draft, dtype=torch.int32, device=device)
    agree = explained = accepted = 0
    res_max, residual_seen = 0.0, set()
    for u in uniforms:
        nm, rm = mlx_verify.rejection_decide(dm, qm, pm, mx.array(u))
        with torch.inference_mode():
            nt, rt = torch_verify.rejection_decide(dt, qt, pt, torch.from_numpy(u).to(device))
        nm, nt = int(nm.item()), int(nt.item())
        accepted += nm
        if nm == nt:
            agree += 1
            if nm not in residual_seen:  # the residual row depends on n_accepted only
                residual_seen.add(nm)
                res_max = max(res_max, float(np.abs(np_mlx(rm) - np_torch(rt)).max()))
            continue
        j = min(nm, nt)  # the first position the two decided differently
        lo, hi = sorted((keep["mlx"][j], keep["torch"][j]))
        explained += bool(lo <= float(u[j]) <= hi)
    draws = len(uniforms)
    return DecisionRow(key, len(draft), draws, agree, explained, draws - agree - explained, accepted / draws,
                       res_max, float(np.abs(keep["mlx"] - keep["torch"]).max()))


def decision_agreement(lm, tl, prompts: Sequence[tuple[Any, list[int]]], k: int, draws: int, seed: int = 0,
                       tick: Callable[[str], None] = lambda _: None) -> list[DecisionRow]:
    """Both backends' ``rejection_decide`` on the same ``draws`` uniform vectors, for one verify
    step per (key, ids) prompt: K drafts sampled from q (``draft_chain``), then p and q on each
    backend. One seeded generator draws the drafts and the uniforms, prompt after prompt."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, ids in prompts:
        draft = draft_chain(lm, ids, k, Q_PARAMS, rng)
        dists = _distributions(lm, tl, ids, draft)
        rows.append(_decide(key, draft, dists, rng.random((draws, k), dtype=np.float32), tl.model.device))
        tick(f"decisions · {key}")
    return rows
