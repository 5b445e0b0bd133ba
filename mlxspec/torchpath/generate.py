"""Batched generation on the torch llama module, for training data: the target writing its own
answers to many prompts at once.

Prompts of different lengths share one batch by left padding: every row's last prompt token
sits in the same column, so each step feeds one new token per row. Padding keys are masked out
of attention. RoPE then sees a row shifted by its padding, which leaves its attention scores
unchanged (they depend only on the distance between query and key), so a padded row decodes
as it would alone, up to float rounding (``tests/test_torchpath.py`` checks greedy tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mlxspec.torchpath.model import Llama


def _prefill_mask(real: torch.Tensor) -> torch.Tensor:
    """(B, 1, W, W): causal, real keys only. A padding row attends to itself, so no row of the
    softmax is empty (its output is never used)."""
    width = real.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=real.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=real.device)
    return ((causal[None] & real[:, None, :]) | eye[None])[:, None]


@torch.inference_mode()
def generate(model: Llama, prompts: Sequence[list[int]], max_new: int, temp: float, seed: int,
             stop: Sequence[int]) -> list[list[int]]:
    """Each prompt's continuation: greedy when ``temp`` is 0, else sampled at ``temp``; a row
    ends at its first ``stop`` token (not included) or after ``max_new`` tokens."""
    device = model.device
    lengths = np.array([len(p) for p in prompts])
    if len(prompts) == 0 or lengths.min() < 1:
        raise ValueError("every prompt needs at least one token")
    width = int(lengths.max())
    tokens = np.zeros((len(prompts), width), np.int64)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):] = p
    real = torch.from_numpy(np.arange(width)[None, :] >= (width - lengths)[:, None]).to(device)
    cache = model.make_cache()
    logits = model(torch.from_numpy(tokens), cache, mask=_prefill_mask(real))[:, -1]
    gen = torch.Generator(device=device).manual_seed(seed)
    stop_ids = torch.tensor(list(stop), dtype=torch.long, device=device)
    out = torch.zeros((len(prompts), max_new), dtype=torch.long, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    ends = torch.full((len(prompts),), max_new, dtype=torch.long, device=device)
    for step in range(max_new):
        if temp == 0:
            nxt = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits.float() / temp, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
        out[:, step] = nxt
        stopped = torch.isin(nxt, stop_ids) & ~done
        ends[stopped] = step
        done |= stopped
        if bool(done.all()) or step + 1 == max_new:
            break
        real = torch.cat([real, torch.ones_like(real[:, :1])], dim=1)
        logits = model(nxt[:, None], cache, mask=real[:, None, None, :])[:, -1]
    rows = out.cpu().numpy()
    return [rows[i, : int(e)].tolist() for i, e in enumerate(ends.cpu().numpy())]
