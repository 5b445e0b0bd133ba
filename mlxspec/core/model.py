"""A llama-family decoder that takes explicit attention masks and per-token positions.

mlx-lm's model call derives positions from the cache offset and builds its own mask, which is
all linear decoding needs. Tree verification needs more (siblings share a position; a node sees
only its ancestors), so the hot path uses this module. Parameter names follow mlx-lm's llama so
the same weights load into either, which is how the reference test compares them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from mlxspec.core.target import Capabilities


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False  # GGUF permutes Q/K for the interleaved rotation: True there
    max_position: int = 4096
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Unowned:
    """Something a module uses but does not own (a target's embedding table, an id map), kept
    outside MLX's parameter tree so it is neither trained nor saved with the module."""

    def __init__(self, value: Any):
        self.value = value


def rope_at(x: mx.array, positions: mx.array, base: float, traditional: bool) -> mx.array:
    """RoPE at arbitrary per-token positions. x: (B, H, L, D); positions: (L,) integers."""
    dims = x.shape[-1]
    freqs = base ** (-mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    angles = positions.astype(mx.float32)[:, None] * freqs[None, :]  # (L, D/2)
    cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
    if traditional:  # pairs are adjacent: (x0, x1), (x2, x3), ...
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = mx.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
        return rotated.reshape(x.shape)
    half = dims // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)

    def __call__(self, x: mx.array, mask, cache: KVCache | None, positions: mx.array | None) -> mx.array:
        cfg = self.cfg
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, cfg.num_heads, -1).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, L, cfg.num_kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, cfg.num_kv_heads, -1).transpose(0, 2, 1, 3)
        if positions is None:
            offset = 0 if cache is None else cache.offset
            rope = dict(traditional=cfg.rope_traditional, base=cfg.rope_theta, scale=1.0)
            q = mx.fast.rope(q, cfg.head_dim, offset=offset, **rope)
            k = mx.fast.rope(k, cfg.head_dim, offset=offset, **rope)
        else:
            q = rope_at(q, positions, cfg.rope_theta, cfg.rope_traditional)
            k = rope_at(k, positions, cfg.rope_theta, cfg.rope_traditional)
        if cache is not None:  # None: a whole sequence at once (training), nothing kept
            k, v = cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=cfg.head_dim**-0.5, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x, mask, cache, positions):
        h = x + self.self_attn(self.input_layernorm(x), mask, cache, positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [Block(cfg) for _ in range(cfg.num_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class Llama(nn.Module):
    """``model(tokens, cache)`` -> logits (B, L, V).

    ``mask``: None (one token), "causal", or an additive/boolean (L, offset+L) array.
    ``positions``: None (offset .. offset+L-1 from the cache) or an (L,) array.
    ``num_layers``: run only the first N blocks, then the final norm and head (self-speculation).
    ``return_hidden``: also return the normed hidden states the head reads (B, L, D).
    """

    capabilities = Capabilities(tree_masks=True, partial_layers=True, hidden_states=True)

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def layers(self) -> list[Block]:
        return self.model.layers

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def __call__(
        self,
        tokens: mx.array,
        cache: list[KVCache] | None,
        mask: mx.array | str | None = None,
        positions: mx.array | None = None,
        num_layers: int | None = None,
        return_hidden: bool = False,
    ) -> mx.array | tuple[mx.array, mx.array]:
        if mask is None and tokens.shape[1] > 1:
            mask = "causal"
        h = self.model.embed_tokens(tokens)
        for layer, c in zip(self.layers[:num_layers], cache or [None] * len(self.layers)):
            h = layer(h, mask, c, positions)
        h = self.model.norm(h)
        logits = self.model.embed_tokens.as_linear(h) if self.cfg.tie_embeddings else self.lm_head(h)
        return (logits, h) if return_hidden else logits
