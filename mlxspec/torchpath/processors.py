"""Logits processors and reported log-probabilities in torch (mirror of
``mlxspec.core.processors``): the same definitions (mlx-lm's, in its order), the same windows
(``core.processors.prefix_tails``), so a torch target is processed as an MLX one."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mlxspec.core.processors import check_bias_ids
from mlxspec.core.sampling import SamplingParams


def process_logits(logits: torch.Tensor, tails: torch.Tensor, real: torch.Tensor | None,
                   params: SamplingParams) -> torch.Tensor:
    """``core.processors.process_logits``: (rows, V) logits, each row with its own window."""
    x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32).clone()
    if params.logit_bias:
        check_bias_ids(params, x.shape[-1])
        ids, bias = zip(*params.logit_bias)
        x[:, torch.tensor(ids, device=x.device)] += torch.tensor(bias, dtype=x.dtype, device=x.device)
    tails = tails.to(device=x.device, dtype=torch.long)
    if params.repetition_penalty != 1:
        window = tails[:, -params.repetition_context_size:]
        seen = x.gather(-1, window)
        penalised = torch.where(seen < 0, seen * params.repetition_penalty, seen / params.repetition_penalty)
        x = x.scatter(-1, window, penalised)
    if params.presence_penalty != 0:  # once per distinct token: a write, not an accumulation
        window = tails[:, -params.presence_context_size:]
        x = x.scatter(-1, window, x.gather(-1, window) - params.presence_penalty)
    if params.frequency_penalty != 0:  # once per occurrence
        size = params.frequency_context_size
        window = tails[:, -size:]
        weights = torch.ones(window.shape, dtype=x.dtype, device=x.device) if real is None else real[:, -size:]
        x = x.scatter_add(-1, window, -params.frequency_penalty * weights.to(device=x.device, dtype=x.dtype))
    return x


def step_logprobs(logits: torch.Tensor, parents: Sequence[int], drafts: torch.Tensor | None, nxt: torch.Tensor,
                  top: int) -> tuple:
    """``core.processors.step_logprobs``: (log-probability of ``nxt`` per row, of each node at
    its parent's row or None, the ``top`` alternatives' ids and log-probabilities or None)."""
    lp = torch.log_softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1)
    at_next = lp[:, nxt.to(lp.device).long()]
    at_node = None
    if parents:
        rows = torch.tensor([p + 1 for p in parents], device=lp.device)
        at_node = lp[rows].gather(-1, drafts.to(lp.device).long()[:, None])[:, 0]
    if top <= 0:
        return at_next, at_node, None, None
    values, ids = torch.topk(lp, top, dim=-1)
    return at_next, at_node, ids.to(torch.int32), values
