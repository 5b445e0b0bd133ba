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


def rope_tables(cfg: LlamaConfig, length: int, offset: int, positions: mx.array | None,
                dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """(cos, sin), each (1, 1, L, D/2), for one pass: built once and shared by every layer's
    queries and keys. Without ``positions`` they are read out of ``mx.fast.rope`` itself, on a
    unit input (1 in the first slot of every rotated pair), so the values are exactly those the
    fast op uses at ``offset``; with ``positions`` they are ``rope_at``'s."""
    d, half = cfg.head_dim, cfg.head_dim // 2
    if positions is None:
        unit = mx.array([1.0, 0.0] * half if cfg.rope_traditional else [1.0] * half + [0.0] * half, dtype)
        r = mx.fast.rope(mx.broadcast_to(unit, (1, 1, length, d)), d, traditional=cfg.rope_traditional,
                         base=cfg.rope_theta, scale=1.0, offset=offset)
        return (r[..., 0::2], r[..., 1::2]) if cfg.rope_traditional else (r[..., :half], r[..., half:])
    freqs = cfg.rope_theta ** (-mx.arange(0, d, 2, dtype=mx.float32) / d)
    angles = positions.astype(mx.float32)[:, None] * freqs[None, :]
    return mx.cos(angles).astype(dtype)[None, None], mx.sin(angles).astype(dtype)[None, None]


def rotate(x: mx.array, cos: mx.array, sin: mx.array, traditional: bool) -> mx.array:
    """RoPE with precomputed tables, the same arithmetic as ``rope_at`` and MLX's own fallback."""
    if traditional:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return mx.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    half = x.shape[-1] // 2
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


# Passes up to this many tokens (verify passes, single tokens) run compiled; longer ones (prefill
# chunks) would trace once per length for little gain.
COMPILE_MAX_TOKENS = 16


def plain_float(block: Block) -> bool:
    """Whether a block's projections are plain float ``Linear``s without bias (not quantized)."""
    a, m = block.self_attn, block.mlp
    return all(type(x) is nn.Linear and "bias" not in x
               for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj))


class CpuPath:
    """The same forward as the blocks' own, with fewer ops, for MLX's CPU backend.

    On the CPU, RMSNorm, RoPE and attention run as fallbacks made of small ops, and every op
    costs microseconds of dispatch whatever its size: a one-token pass of the default model was
    ~4,300 ops. This path builds the RoPE tables (read out of ``mx.fast.rope`` itself) and the
    causal mask once per pass instead of once per layer, and for passes of up to
    ``COMPILE_MAX_TOKENS`` tokens runs the work before and after attention as ``mx.compile``d
    functions taking the weights as inputs (one trace per pass length serves every layer; the KV
    cache update and attention stay outside, as their shapes grow with the context). The
    arithmetic is the blocks' own, op for op. Fusing q/k/v and gate/up into one matmul each was
    measured as well and was not faster here (BENCHMARKS.md, "Where a step's time goes"), so the
    blocks' weights are used as they are: nothing is transformed at load time."""

    def __init__(self, cfg: LlamaConfig):
        self.cfg = cfg
        self.compiled = (mx.compile(self.before_attention), mx.compile(self.after_attention))
        self.compile_max_tokens = COMPILE_MAX_TOKENS  # 0: never compiled (A/B measurements)

    def before_attention(self, x, norm_w, q_w, k_w, v_w, cos, sin):
        c = self.cfg
        B, L, _ = x.shape
        h = mx.fast.rms_norm(x, norm_w, c.rms_norm_eps)
        q, k, v = ((h @ w.T).reshape(B, L, -1, c.head_dim).transpose(0, 2, 1, 3) for w in (q_w, k_w, v_w))
        return rotate(q, cos, sin, c.rope_traditional), rotate(k, cos, sin, c.rope_traditional), v

    def after_attention(self, x, attn, o_w, norm_w, gate_w, up_w, down_w):
        B, L, _ = x.shape
        h = x + attn.transpose(0, 2, 1, 3).reshape(B, L, -1) @ o_w.T
        n = mx.fast.rms_norm(h, norm_w, self.cfg.rms_norm_eps)
        return h + (nn.silu(n @ gate_w.T) * (n @ up_w.T)) @ down_w.T

    def layers(self, blocks: list[Block], h: mx.array, cache: list[KVCache], mask, positions) -> mx.array:
        c = self.cfg
        L, offset = h.shape[1], cache[0].offset
        if isinstance(mask, str):  # causal over the cache, as a boolean array built once
            mask = None if L == 1 else mx.arange(offset, offset + L)[:, None] >= mx.arange(offset + L)[None]
        cos, sin = rope_tables(c, L, offset, positions, h.dtype)
        before, after = self.compiled if L <= self.compile_max_tokens else (self.before_attention, self.after_attention)
        for b, kv in zip(blocks, cache):
            a, m = b.self_attn, b.mlp
            q, k, v = before(h, b.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, cos, sin)
            k, v = kv.update_and_fetch(k, v)
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=c.head_dim**-0.5, mask=mask)
            h = after(h, out, a.o_proj.weight, b.post_attention_layernorm.weight, m.gate_proj.weight,
                      m.up_proj.weight, m.down_proj.weight)
        return h


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
        self._cpu = Unowned(None)
        self.use_cpu_path = True  # False: the blocks' own path everywhere (A/B measurements)

    @property
    def layers(self) -> list[Block]:
        return self.model.layers

    def cpu_path(self) -> CpuPath | None:
        """The ``CpuPath`` where it applies: switched on, computing on the CPU, and every block
        holding plain float weights (quantized models run the blocks' own path)."""
        if not self.use_cpu_path or mx.default_device().type != mx.DeviceType.cpu:
            return None
        if not all(plain_float(b) for b in self.layers):
            return None
        if self._cpu.value is None:
            self._cpu.value = CpuPath(self.cfg)
        return self._cpu.value

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
        path = self.cpu_path() if cache else None  # no cache: training or scoring, the blocks' own path
        if path is not None:
            h = path.layers(self.layers[:num_layers], h, cache, mask, positions)
        else:
            for layer, c in zip(self.layers[:num_layers], cache or [None] * len(self.layers)):
                h = layer(h, mask, c, positions)
        h = self.model.norm(h)
        logits = self.model.embed_tokens.as_linear(h) if self.cfg.tie_embeddings else self.lm_head(h)
        return (logits, h) if return_hidden else logits
