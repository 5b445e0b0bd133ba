"""A llama-family decoder that takes explicit attention masks and per-token positions.

mlx-lm's model call derives positions from the cache offset and builds its own mask, which is
all linear decoding needs. Tree verification needs more (siblings share a position; a node sees
only its ancestors), so the hot path uses this module. Parameter names follow mlx-lm's classes
so the same weights load into either, which is how the reference tests compare them.

One module covers the families Mac users run (issue 11), each feature a config switch whose
default is plain llama: Llama 3.x RoPE scaling and explicit head sizes, Qwen2 q/k/v biases,
Qwen3 per-head q/k norms, Phi-3 (its fused projections are split at load time), Gemma 2 / 3
text (offset norms, sandwich norms, soft-capping, sliding-window layers). The arithmetic of
each follows mlx-lm 0.32's own class for that family.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from mlxspec.core.target import Capabilities
from mlxspec.errors import UnsupportedArchitecture

# RoPE scaling types we implement (a "type"/"rope_type" in config.json), and GGUF's own.
ROPE_TYPES = ("default", "linear", "llama3", "longrope")
FREQ_FACTORS = "freq_factors"  # llama.cpp's rope_freqs tensor: one divisor per rotated pair


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
    # Beyond plain llama; every default below is plain llama.
    model_type: str = "llama"  # the mlx-lm family: what export and the reference rebuild
    explicit_head_dim: int | None = None  # Mistral-Nemo, Qwen3, Gemma: not hidden / heads
    qkv_bias: bool = False  # Qwen2; llama's attention_bias (with o_bias)
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE
    # config.json's rope_scaling (or {"rope_type": "freq_factors", "factors": [...]} from GGUF);
    # excluded from hashing, being a dict.
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    partial_rotary_factor: float = 1.0  # Phi-3 family: RoPE on the first part of each head only
    # Gemma: norms scale by (1 + w) and also wrap the attention and MLP outputs; GELU MLP.
    gemma: bool = False
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(hidden), as mlx-lm rounds it)
    query_pre_attn_scalar: float | None = None  # attention scale its ** -0.5 (else head_dim's)
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: the same on the logits
    sliding_window: int | None = None  # Gemma 3: layers that see only the last N positions ...
    sliding_window_pattern: int = 1  # ... all but every N-th layer (1: none slide)
    rope_local_theta: float | None = None  # Gemma 3: RoPE base of the sliding layers

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def rope_dims(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and (layer + 1) % self.sliding_window_pattern != 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Unowned:
    """Something a module uses but does not own (a target's embedding table, an id map), kept
    outside MLX's parameter tree so it is neither trained nor saved with the module."""

    def __init__(self, value: Any):
        self.value = value


# ----------------------------------------------------------------------------- RoPE


def rope_type(scaling: dict[str, Any] | None) -> str:
    """The scaling kind, read as mlx-lm's ``initialize_rope`` reads it."""
    if not scaling:
        return "default"
    return scaling.get("type") or scaling.get("rope_type", "default")


def check_rope_scaling(scaling: dict[str, Any] | None) -> None:
    kind = rope_type(scaling)
    if kind not in (*ROPE_TYPES, "su", FREQ_FACTORS):
        raise UnsupportedArchitecture(
            f"unsupported rope_scaling type {kind!r}; supported: {', '.join(ROPE_TYPES)}")


def _llama3_periods(dims: int, base: float, s: dict[str, Any]) -> mx.array:
    """mlx-lm's ``Llama3RoPE`` frequencies, op for op, so both hold the same floats: low
    frequencies stretched by ``factor``, high ones kept, the band between interpolated."""
    factor = s["factor"]
    low_freq_factor = s.get("low_freq_factor", 1.0)
    high_freq_factor = s.get("high_freq_factor", 4.0)
    old_context_len = s.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    freqs = base ** (mx.arange(0, dims, 2) / dims)
    wavelens = 2 * mx.pi * freqs
    freqs = mx.where(wavelens > low_freq_wavelen, freqs * factor, freqs)
    is_medium_freq = (wavelens > high_freq_wavelen) & (wavelens < low_freq_wavelen)
    smooth_factors = (old_context_len / wavelens - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smooth_freqs = freqs / ((1 - smooth_factors) / factor + smooth_factors)
    return mx.where(is_medium_freq, smooth_freqs, freqs)


class Rope:
    """One layer's rotary embedding. ``mx.fast.rope`` at consecutive positions, ``rope_at`` at
    explicit ones (trees), with the same frequencies: the base's, or ``periods`` (what
    ``mx.fast.rope`` takes as ``freqs``: angle = position / period) where the model scales them.
    ``scale`` multiplies positions (linear scaling); ``mscale`` the rotated part of q and k
    (Phi-3's long-context RoPE)."""

    def __init__(self, dims: int, base: float, traditional: bool, periods: mx.array | None = None,
                 scale: float = 1.0, mscale: float = 1.0):
        self.dims, self.base, self.traditional = dims, base, traditional
        self.periods, self.scale, self.mscale = periods, scale, mscale

    def __call__(self, x: mx.array, offset: int, positions: mx.array | None) -> mx.array:
        if self.mscale != 1.0:
            x = x.at[..., : self.dims].multiply(self.mscale)
        if positions is not None:
            return rope_at(x, positions * self.scale if self.scale != 1.0 else positions, self.base,
                           self.traditional, self.periods, self.dims)
        if self.periods is None:
            return mx.fast.rope(x, self.dims, offset=offset, traditional=self.traditional, base=self.base,
                                scale=self.scale)
        return mx.fast.rope(x, self.dims, offset=offset, traditional=self.traditional, base=None,
                            scale=self.scale, freqs=self.periods)

    def tables(self, d: int, length: int, offset: int, positions: mx.array | None,
               dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """(cos, sin), each (1, 1, L, d/2), for a head of ``d`` = ``dims`` (see ``rope_tables``)."""
        half = d // 2
        if positions is None:
            unit = mx.array([1.0, 0.0] * half if self.traditional else [1.0] * half + [0.0] * half, dtype)
            freqs = {} if self.periods is None else {"freqs": self.periods}
            r = mx.fast.rope(mx.broadcast_to(unit, (1, 1, length, d)), d, traditional=self.traditional,
                             base=None if freqs else self.base, scale=self.scale, offset=offset, **freqs)
            return (r[..., 0::2], r[..., 1::2]) if self.traditional else (r[..., :half], r[..., half:])
        if self.scale != 1.0:
            positions = positions * self.scale
        angles = positions.astype(mx.float32)[:, None] * _inverse_periods(d, self.base, self.periods)[None, :]
        return mx.cos(angles).astype(dtype)[None, None], mx.sin(angles).astype(dtype)[None, None]


def _inverse_periods(dims: int, base: float, periods: mx.array | None) -> mx.array:
    if periods is None:
        return base ** (-mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    return 1.0 / periods  # what mx.fast.rope computes from ``freqs``: the angles agree exactly


def layer_rope(cfg: LlamaConfig, layer: int = 0) -> Rope:
    """The RoPE of block ``layer``, scaled as config.json's ``rope_scaling`` says (mlx-lm's
    ``initialize_rope`` and Phi-3's ``SuScaledRoPE``). Gemma 3's sliding layers use their own
    base, unscaled."""
    dims, base, trad = cfg.rope_dims, cfg.rope_theta, cfg.rope_traditional
    if cfg.is_sliding(layer) and cfg.rope_local_theta is not None:
        return Rope(dims, cfg.rope_local_theta, trad)
    s = cfg.rope_scaling
    check_rope_scaling(s)
    kind = rope_type(s)
    if kind == "linear":
        return Rope(dims, base, trad, scale=1 / s["factor"])
    if kind == "llama3":
        return Rope(dims, base, trad, _llama3_periods(dims, base, s))
    if kind in ("longrope", "su"):  # mlx-lm always takes the long factors
        original = s["original_max_position_embeddings"]
        factor = cfg.max_position / original
        mscale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        plain = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        periods = mx.array(s["long_factor"], dtype=mx.float32) * plain
        return Rope(dims, base, False, periods, mscale=mscale)
    if kind == FREQ_FACTORS:  # llama.cpp divides each pair's frequency by its factor
        periods = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims) * mx.array(s["factors"], dtype=mx.float32)
        return Rope(dims, base, trad, periods)
    return Rope(dims, base, trad)


def rope_at(x: mx.array, positions: mx.array, base: float, traditional: bool,
            periods: mx.array | None = None, dims: int | None = None) -> mx.array:
    """RoPE at arbitrary per-token positions. x: (B, H, L, D); positions: (L,) integers (or
    floats, scaled). Only the first ``dims`` features rotate (all by default), as in
    ``mx.fast.rope``."""
    dims = dims or x.shape[-1]
    angles = positions.astype(mx.float32)[:, None] * _inverse_periods(dims, base, periods)[None, :]  # (L, D/2)
    cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
    if dims < x.shape[-1]:
        return mx.concatenate([rotate(x[..., :dims], cos, sin, traditional), x[..., dims:]], axis=-1)
    return rotate(x, cos, sin, traditional)


def rope_tables(cfg: LlamaConfig, length: int, offset: int, positions: mx.array | None,
                dtype: mx.Dtype, rope: Rope | None = None) -> tuple[mx.array, mx.array]:
    """(cos, sin), each (1, 1, L, D/2), for one pass: built once and shared by every layer's
    queries and keys. Without ``positions`` they are read out of ``mx.fast.rope`` itself, on a
    unit input (1 in the first slot of every rotated pair), so the values are exactly those the
    fast op uses at ``offset``; with ``positions`` they are ``rope_at``'s. ``rope``: the layers'
    (``layer_rope(cfg)`` by default), built once by a caller that makes tables every pass."""
    return (rope or layer_rope(cfg)).tables(cfg.head_dim, length, offset, positions, dtype)


def rotate(x: mx.array, cos: mx.array, sin: mx.array, traditional: bool) -> mx.array:
    """RoPE with precomputed tables, the same arithmetic as ``rope_at`` and MLX's own fallback."""
    if traditional:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return mx.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


# ----------------------------------------------------------------------------- masks and attention


def causal_mask(length: int, offset: int) -> mx.array:
    """The boolean (L, offset+L) mask that ``"causal"`` stands for."""
    return mx.arange(offset, offset + length)[:, None] >= mx.arange(offset + length)[None]


def window_mask(mask, length: int, offset: int, positions: mx.array | None, window: int):
    """``mask`` restricted to keys less than ``window`` positions behind each query (a sliding
    layer). The cache holds positions 0..offset-1; the pass's tokens are at ``positions``
    (offset.. by default), so tree nodes are windowed by their depth, as decoding would."""
    if offset + length <= window:  # every key is in every window
        return mask
    q = mx.arange(offset, offset + length) if positions is None else positions
    k = mx.concatenate([mx.arange(offset), q]) if positions is not None else mx.arange(offset + length)
    near = (q[:, None] - k[None]) < window
    if mask is None or isinstance(mask, str):
        return near if mask is None else near & causal_mask(length, offset)
    if mask.dtype == mx.bool_:
        return mask & near
    return mx.where(near, mask, mx.array(-mx.inf, mask.dtype))


def softcapped_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, cap: float, mask) -> mx.array:
    """Attention whose scores pass through cap * tanh(s / cap) before the softmax (Gemma 2),
    which the fused kernel cannot do; mlx-lm's arithmetic."""
    B, H, L, D = q.shape
    repeats = H // k.shape[1]
    q = q * scale
    if repeats > 1:
        q = q.reshape(B, k.shape[1], repeats, L, D)
        k, v = mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = q @ k.swapaxes(-1, -2)
    scores = mx.tanh(scores / cap) * cap
    if isinstance(mask, str):
        mask = causal_mask(L, k.shape[-2] - L)
    if mask is not None:
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
        else:
            scores = scores + mask
    out = mx.softmax(scores, precise=True, axis=-1) @ v
    return out.reshape(B, H, L, D) if repeats > 1 else out


# ----------------------------------------------------------------------------- modules


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the stored weight is an offset from 1."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


def make_norm(cfg: LlamaConfig, dims: int) -> nn.Module:
    return GemmaRMSNorm(dims, cfg.rms_norm_eps) if cfg.gemma else nn.RMSNorm(dims, eps=cfg.rms_norm_eps)


def residual(x: mx.array, y: mx.array) -> mx.array:
    """x + y; in float16 clipped to its range, as mlx-lm's Gemma 3 does (its activations grow
    past float16's maximum)."""
    if x.dtype != mx.float16:
        return x + y
    bound = mx.finfo(mx.float16).max
    return mx.clip(x.astype(mx.float32) + y.astype(mx.float32), -bound, bound).astype(mx.float16)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm, self.k_norm = make_norm(cfg, hd), make_norm(cfg, hd)
        self.rope = layer_rope(cfg, layer)

    def __call__(self, x: mx.array, mask, cache: KVCache | None, positions: mx.array | None) -> mx.array:
        cfg = self.cfg
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, cfg.num_heads, -1)
        k = self.k_proj(x).reshape(B, L, cfg.num_kv_heads, -1)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, cfg.num_kv_heads, -1).transpose(0, 2, 1, 3)
        # with explicit positions the cache's offset is not read (training's stand-in caches have none)
        offset = 0 if cache is None or positions is not None else cache.offset
        q, k = self.rope(q, offset, positions), self.rope(k, offset, positions)
        if cache is not None:  # None: a whole sequence at once (training), nothing kept
            k, v = cache.update_and_fetch(k, v)
        if cfg.attn_softcap:
            out = softcapped_attention(q, k, v, cfg.attn_scale, cfg.attn_softcap, mask)
        else:
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=cfg.attn_scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = nn.gelu_approx if cfg.gemma else nn.silu

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """A decoder layer. Gemma's (``cfg.gemma``) also norms the attention and MLP outputs
    (``post_attention_layernorm`` is then that output norm, and ``pre_feedforward_layernorm``
    the MLP's input norm, mlx-lm's names)."""

    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        if cfg.gemma:
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
        self.sandwich = cfg.gemma
        self.sliding = cfg.is_sliding(layer)

    def __call__(self, x, mask, cache, positions):
        if self.sandwich:
            r = self.self_attn(self.input_layernorm(x), mask, cache, positions)
            h = residual(x, self.post_attention_layernorm(r))
            return residual(h, self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))))
        h = x + self.self_attn(self.input_layernorm(x), mask, cache, positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [Block(cfg, i) for i in range(cfg.num_layers)]
        self.norm = make_norm(cfg, cfg.hidden_size)


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
    measured as well and was not faster on this CPU backend, so the
    blocks' weights are used as they are: nothing is transformed at load time.

    It covers llama blocks with any head size and RoPE frequencies (``handles``); the other
    families' extras (q/k norms, partial or x-scaled RoPE, Gemma's blocks) run the blocks' own
    path. A variant being measured (``benchmarks/mlx_invariant.py``) overrides the compiled
    halves, ``pass_mask`` and ``attend``, and runs through ``Llama.run_cpu_path``."""

    def __init__(self, cfg: LlamaConfig):
        self.cfg = cfg
        self.rope = layer_rope(cfg)
        self.compiled = (mx.compile(self.before_attention), mx.compile(self.after_attention))
        self.compile_max_tokens = COMPILE_MAX_TOKENS  # 0: never compiled (A/B measurements)

    @staticmethod
    def handles(cfg: LlamaConfig) -> bool:
        return (not cfg.gemma and not cfg.qk_norm and cfg.rope_dims == cfg.head_dim
                and rope_type(cfg.rope_scaling) not in ("longrope", "su"))

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

    def pass_mask(self, mask, length: int, offset: int, dtype: mx.Dtype):
        """The mask every layer's ``attend`` takes, built once per pass: "causal" as a boolean
        array (None for one token: every key)."""
        if isinstance(mask, str):
            return None if length == 1 else causal_mask(length, offset)
        return mask

    def attend(self, q: mx.array, cache: KVCache, keys: mx.array, values: mx.array, mask) -> mx.array:
        """Attention over ``keys``/``values`` (what ``cache`` holds after this pass's update)."""
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.cfg.head_dim**-0.5, mask=mask)

    def layers(self, blocks: list[Block], h: mx.array, cache: list[KVCache], mask, positions,
               taps: tuple[int, ...] = ()) -> tuple[mx.array, list[mx.array]]:
        """The blocks' output, and the residual stream entering each block index in ``taps``
        (``len(blocks)``: the last block's output, before the final norm)."""
        c = self.cfg
        L, offset = h.shape[1], cache[0].offset
        mask = self.pass_mask(mask, L, offset, h.dtype)
        cos, sin = rope_tables(c, L, offset, positions, h.dtype, self.rope)
        before, after = self.compiled if L <= self.compile_max_tokens else (self.before_attention, self.after_attention)
        tapped = []
        for i, (b, kv) in enumerate(zip(blocks, cache)):
            if i in taps:
                tapped.append(h)
            a, m = b.self_attn, b.mlp
            q, k, v = before(h, b.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, cos, sin)
            out = self.attend(q, kv, *kv.update_and_fetch(k, v), mask)
            h = after(h, out, a.o_proj.weight, b.post_attention_layernorm.weight, m.gate_proj.weight,
                      m.up_proj.weight, m.down_proj.weight)
        return h, tapped + ([h] if len(blocks) in taps else [])


class Llama(nn.Module):
    """``model(tokens, cache)`` -> logits (B, L, V).

    ``mask``: None (one token), "causal", or an additive/boolean (L, offset+L) array.
    ``positions``: None (offset .. offset+L-1 from the cache) or an (L,) array.
    ``num_layers``: run only the first N blocks, then the final norm and head (self-speculation).
    ``return_hidden``: also return the normed hidden states the head reads (B, L, D); or, given
    block indices (``aux_layers``), the residual stream entering each of those blocks (index
    ``num_layers``: the last block's output, before the final norm), concatenated in ascending
    order of index (B, L, n*D): what an EAGLE-3 head reads.
    ``logit_rows``: the logits of the last n positions only (``Capabilities.logit_rows``): the
    last prompt chunk's other rows through the head are work, and up to 100 MB of logits, that
    prefill never reads.
    """

    capabilities = Capabilities(tree_masks=True, partial_layers=True, hidden_states=True, logit_rows=True)

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        check_rope_scaling(cfg.rope_scaling)
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
        """The ``CpuPath`` where it applies: switched on, computing on the CPU, a config it
        handles, and every block holding plain float weights (quantized models run the blocks'
        own path)."""
        if not self.use_cpu_path or mx.default_device().type != mx.DeviceType.cpu:
            return None
        if not CpuPath.handles(self.cfg) or not all(plain_float(b) for b in self.layers):
            return None
        if self._cpu.value is None:
            self._cpu.value = CpuPath(self.cfg)
        return self._cpu.value

    def run_cpu_path(self, path: CpuPath | None) -> None:
        """Run ``path`` (a variant of ``CpuPath`` being measured) wherever the CPU path applies;
        None: the model's own, built on the next pass."""
        self._cpu.value = path

    def make_cache(self) -> list[KVCache]:
        # Sliding layers keep every position too (masked instead of rotated out) so that a
        # rejected draft can be trimmed from any layer.
        return [KVCache() for _ in self.layers]

    def _blocks(self, h: mx.array, cache: list[KVCache] | None, mask, positions,
                num_layers: int | None, taps: tuple[int, ...] = ()) -> tuple[mx.array, list[mx.array]]:
        blocks = self.layers[:num_layers]
        caches = cache or [None] * len(blocks)
        window = self.cfg.sliding_window
        if window is not None and any(b.sliding for b in blocks):
            offset = 0 if not cache else cache[0].offset
            near = window_mask(mask, h.shape[1], offset, positions, window)
        tapped = []
        for i, (layer, c) in enumerate(zip(blocks, caches)):
            if i in taps:
                tapped.append(h)
            h = layer(h, near if layer.sliding else mask, c, positions)
        return h, tapped + ([h] if len(blocks) in taps else [])

    def __call__(
        self,
        tokens: mx.array,
        cache: list[KVCache] | None,
        mask: mx.array | str | None = None,
        positions: mx.array | None = None,
        num_layers: int | None = None,
        return_hidden: bool | tuple[int, ...] = False,
        logit_rows: int | None = None,
    ) -> mx.array | tuple[mx.array, mx.array]:
        cfg = self.cfg
        if mask is None and tokens.shape[1] > 1:
            mask = "causal"
        taps = tuple(sorted(set(return_hidden))) if isinstance(return_hidden, tuple) else ()
        h = self.model.embed_tokens(tokens)
        if cfg.embed_scale is not None:
            h = h * cfg.embed_scale
        path = self.cpu_path() if cache else None  # no cache: training or scoring, the blocks' own path
        if path is not None:
            h, tapped = path.layers(self.layers[:num_layers], h, cache, mask, positions, taps)
        else:
            h, tapped = self._blocks(h, cache, mask, positions, num_layers, taps)
        h = self.model.norm(h)
        read = h if logit_rows is None else h[:, h.shape[1] - logit_rows :]
        logits = self.model.embed_tokens.as_linear(read) if cfg.tie_embeddings else self.lm_head(read)
        if cfg.final_softcap:
            logits = mx.tanh(logits / cfg.final_softcap) * cfg.final_softcap
        if taps:
            return logits, mx.concatenate(tapped, axis=-1)
        return (logits, h) if return_hidden else logits
