"""Parity of the logits: every layer's output and the head's logits of one causal pass on
both backends, and the engine's own forward with a fresh cache, compared as ``RELATIVE``
(each position's error over the largest magnitude at that position). torch is imported
where it is used: it is an optional dependency."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from mlxspec.measure.parity.records import Diff


class DiffSum:
    """Running max / sum of ``RELATIVE`` over arrays compared one by one."""

    def __init__(self, name: str):
        self.name, self.max_rel, self.sum_rel, self.max_abs, self.n = name, 0.0, 0.0, 0.0, 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        """Float32 arithmetic (a prompt's logits are hundreds of MB; the difference of two close
        float32 values is exact), sums in float64."""
        a = a.reshape(-1, a.shape[-1]).astype(np.float32, copy=False)
        b = b.reshape(-1, b.shape[-1]).astype(np.float32, copy=False)
        d = np.abs(a - b)
        self.max_abs = max(self.max_abs, float(d.max()))
        d /= np.maximum(np.abs(a).max(axis=-1, keepdims=True), np.finfo(np.float32).tiny)
        self.max_rel = max(self.max_rel, float(d.max()))
        self.sum_rel += float(d.sum(dtype=np.float64))
        self.n += d.size

    def diff(self) -> Diff:
        return Diff(self.name, self.max_rel, self.sum_rel / self.n if self.n else 0.0, self.max_abs, self.n)


def np_mlx(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def np_torch(x) -> np.ndarray:
    import torch

    return x.detach().to(torch.float32).cpu().numpy()


def torch_tokens(ids: Sequence[int], device):
    import torch

    return torch.tensor([list(ids)], dtype=torch.int64, device=device)


def mlx_logits(model, ids: Sequence[int]) -> np.ndarray:
    """The last row's logits of one fresh pass with a KV cache (the engine's forward)."""
    return np_mlx(model(mx.array([list(ids)], mx.int32), model.make_cache())[0, -1])


def torch_logits(model, ids: Sequence[int]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return np_torch(model(torch_tokens(ids, model.device), model.make_cache())[0, -1])


def _mlx_walk(model, ids: Sequence[int]) -> list[np.ndarray]:
    """The outputs of the embedding, every block, the final norm and the head, one causal pass."""
    m = model
    h = m.model.embed_tokens(mx.array([list(ids)], mx.int32))
    if m.cfg.embed_scale is not None:
        h = h * m.cfg.embed_scale
    outs = [np_mlx(h)]
    for layer in m.layers:
        h = layer(h, "causal", None, None)
        mx.eval(h)
        outs.append(np_mlx(h))
    h = m.model.norm(h)
    outs.append(np_mlx(h))
    logits = m.model.embed_tokens.as_linear(h) if m.cfg.tie_embeddings else m.lm_head(h)
    outs.append(np_mlx(logits))
    return outs


def _torch_walk(model, ids: Sequence[int]) -> list[np.ndarray]:
    import torch

    from mlxspec.torchpath.model import pass_inputs  # imports torch

    with torch.inference_mode():
        h = model.model.embed_tokens(torch_tokens(ids, model.device))
        mask, positions = pass_inputs(len(ids), 0, "causal", None, model.device)
        cos, sin = model.rope.tables(positions, h.dtype)
        outs = [np_torch(h)]
        for layer in model.layers:
            h = layer(h, mask, None, model.rope, cos, sin)
            outs.append(np_torch(h))
        h = model.model.norm(h)
        outs.append(np_torch(h))
        outs.append(np_torch(model.head(h)))
    return outs


def layer_diffs(lm, tl, prompt_ids: Sequence[Sequence[int]], tick: Callable[[str], None] = lambda _: None,
                labels: Sequence[str] | None = None) -> list[Diff]:
    """Every layer's output and the logits on both backends, over every prompt (``RELATIVE``):
    rows embed, layer 0..N-1, norm, head (layer by layer, no cache), then the engine's own
    forward with a fresh cache, "logits (cached pass)"."""
    import torch

    names = ["embed", *(f"layer {i}" for i in range(lm.config.num_layers)), "norm", "head"]
    sums = [DiffSum(n) for n in names]
    cached = DiffSum("logits (cached pass)")
    for i, ids in enumerate(prompt_ids):
        for s, a, b in zip(sums, _mlx_walk(lm.model, ids), _torch_walk(tl.model, ids)):
            s.add(a, b)
        a = np_mlx(lm.model(mx.array([list(ids)], mx.int32), lm.model.make_cache())[0])
        with torch.inference_mode():
            b = np_torch(tl.model(torch_tokens(ids, tl.model.device), tl.model.make_cache())[0])
        cached.add(a, b)
        tick(f"layers · {labels[i] if labels else i}")
    return [s.diff() for s in sums] + [cached.diff()]
