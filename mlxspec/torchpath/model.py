"""The llama module for torch, with the call of ``core.model.Llama``: explicit masks and
per-token positions (trees), the first L blocks only (self:L), the final hidden states (eagle
heads). Also the two trained drafters that carry weights, the draft model and the eagle head.

Each is built from its MLX twin (``from_mlx``) with the same parameter names, so the weights
are the ones the project's loader read, copied tensor by tensor. The arithmetic follows
``core.model``: RoPE with the same frequencies (read off the MLX module), RMSNorm, SiLU MLP,
grouped-query attention with a boolean mask (True: attend).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import torch
import torch.nn.functional as F
from mlx.utils import tree_flatten
from torch import nn

from mlxspec.core.model import LlamaConfig, layer_rope, rope_type
from mlxspec.core.target import Capabilities
from mlxspec.errors import MlxspecError
from mlxspec.torchpath import int4, ops
from mlxspec.torchpath.cache import KVCache, PackedCaches
from mlxspec.torchpath.int4 import Int4Linear
from mlxspec.torchpath.invariant import sdpa

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_supported(cfg: LlamaConfig) -> None:
    """The torch module implements llama-type blocks (llama, mistral, qwen2, qwen3); the
    other families' extras run on the MLX backend only."""
    extras = {
        "Gemma blocks": cfg.gemma, "embedding scale": cfg.embed_scale is not None,
        "soft-capping": bool(cfg.attn_softcap or cfg.final_softcap), "sliding-window layers": cfg.sliding_window is not None,
        "partial RoPE": cfg.partial_rotary_factor != 1.0,
        "long-context RoPE": rope_type(cfg.rope_scaling) in ("longrope", "su"),
    }
    missing = [name for name, used in extras.items() if used]
    if missing:
        raise MlxspecError(f"the torch backend implements llama-type blocks; this {cfg.model_type} model uses "
                           f"{', '.join(missing)}: run it with --backend mlx")


def _tensor(x: mx.array, device: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(x.astype(mx.float32))).to(device=device, dtype=dtype)


def _load(module: nn.Module, mlx_module: Any, device: str, dtype: torch.dtype,
          params: dict[str, mx.array] | None = None) -> None:
    """Copy every parameter of ``mlx_module`` (or ``params``) into ``module`` by name (both sides
    must hold the same set: a quantized MLX model has scales the torch module has no place for;
    ``Int4Linear`` layers already installed bring their own)."""
    params = dict(tree_flatten(mlx_module.parameters())) if params is None else params
    if any(k.endswith(".scales") for k in params):
        raise MlxspecError("the torch backend needs float weights; load the model with --dtype float32")
    state = {k: _tensor(v, device, dtype) for k, v in params.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    own = {f"{name}.{b}" for name, m in module.named_modules() if isinstance(m, Int4Linear)
           for b, t in m.named_buffers(recurse=False) if t is not None}
    missing = [k for k in missing if k not in own]
    if missing or unexpected:
        raise MlxspecError(f"weights do not fit the torch module: missing {missing[:3]}, unexpected {unexpected[:3]}")
    module.to(device=device, dtype=dtype).requires_grad_(False)  # load_state_dict keeps the module's float32


class Rope:
    """RoPE tables for one pass, from the MLX module's own frequencies (``layer_rope``)."""

    def __init__(self, cfg: LlamaConfig, device: str):
        r = layer_rope(cfg)
        inv = 1.0 / r.periods if r.periods is not None else r.base ** (-mx.arange(0, r.dims, 2, dtype=mx.float32) / r.dims)
        self.inv = torch.from_numpy(np.array(inv.astype(mx.float32))).to(device)
        self.scale, self.traditional = r.scale, r.traditional

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (1, 1, L, D) at ``positions`` (L,), laid out as ``rotate`` reads them:
        each angle's cosine at both elements of its pair, its sine negated at the first."""
        angles = (positions.to(torch.float32) * self.scale)[:, None] * self.inv[None, :]
        cos, sin = torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)
        if self.traditional:  # pairs (2i, 2i + 1)
            cos, sin = torch.stack([cos, cos], dim=-1).flatten(-2), torch.stack([-sin, sin], dim=-1).flatten(-2)
        else:  # pairs (i, i + D/2)
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
        return cos[None, None], sin[None, None]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rotate(x, cos, sin, self.traditional)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, traditional: bool) -> torch.Tensor:
    """Each pair (x1, x2) to (x1 cos - x2 sin, x2 cos + x1 sin): the products and sums MLX's
    rope rounds, in three whole-tensor operations after the pairs are swapped (``Rope.tables``'
    layout; ``traditional``: pairs (2i, 2i + 1), else (i, i + D/2))."""
    if traditional:
        swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    else:
        swapped = torch.cat(x.chunk(2, dim=-1)[::-1], dim=-1)
    return x * cos + swapped * sin


class RMSNorm(nn.Module):
    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dims))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(hd, cfg.rms_norm_eps), RMSNorm(hd, cfg.rms_norm_eps)
        self.attend = sdpa  # (q, k, v, mask, scale) -> out; invariant.make_batch_invariant swaps it
        self.fused_qkv: Any = None  # q, k and v as one product (invariant.fuse_projections), not a submodule
        self.widths = [cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd]

    def forward(self, x, mask, cache: KVCache | None, rope: Rope, cos, sin) -> torch.Tensor:
        cfg = self.cfg
        B, L, _ = x.shape
        if self.fused_qkv is not None and not cfg.qk_norm:  # q and k rotated as one tensor of heads
            qk, v = self.fused_qkv(x).split([self.widths[0] + self.widths[1], self.widths[2]], dim=-1)
            q, k = rope.rotate(qk.reshape(B, L, -1, cfg.head_dim).transpose(1, 2), cos, sin).split(
                [cfg.num_heads, cfg.num_kv_heads], dim=1)
        else:
            if self.fused_qkv is not None:
                q, k, v = self.fused_qkv(x).split(self.widths, dim=-1)
            else:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q, k = q.reshape(B, L, cfg.num_heads, -1), k.reshape(B, L, cfg.num_kv_heads, -1)
            if cfg.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rope.rotate(q.transpose(1, 2), cos, sin), rope.rotate(k.transpose(1, 2), cos, sin)
        v = v.reshape(B, L, cfg.num_kv_heads, -1).transpose(1, 2)
        if isinstance(cache, PackedCaches):  # several sequences' rows: each attends to its own cache
            out = cache.attend(self.attend, q, k, v, cfg.attn_scale)
        else:
            if cache is not None:
                k, v = cache.update_and_fetch(k, v)
            out = self.attend(q, k, v, mask, cfg.attn_scale)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = F.silu  # invariant.make_batch_invariant swaps it
        self.fused_gate_up: Any = None  # gate and up as one product (invariant.fuse_projections)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_gate_up is not None:
            gate, up = self.fused_gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, mask, cache, rope, cos, sin) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache, rope, cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


def pass_inputs(length: int, offset: int, mask, positions, device) -> tuple[Any, torch.Tensor]:
    """The boolean mask (None for one token) and positions (L,) of a pass of ``length``
    tokens after ``offset`` cached ones, as ``core.model.Llama`` reads its arguments."""
    if isinstance(mask, np.ndarray):
        mask = torch.from_numpy(mask)
    if isinstance(mask, str) or (mask is None and length > 1):
        rows = torch.arange(offset, offset + length, device=device)
        mask = rows[:, None] >= torch.arange(offset + length, device=device)[None]
    elif mask is not None:
        mask = mask.to(device)
        if mask.dtype != torch.bool:  # additive: 0 where attended
            mask = mask == 0
    if positions is None:
        positions = torch.arange(offset, offset + length, device=device)
    return mask, positions.to(device)


class Llama(nn.Module):
    """``model(tokens, cache)`` -> logits (B, L, V); the arguments of ``core.model.Llama``."""

    capabilities = Capabilities(tree_masks=True, partial_layers=True, hidden_states=True, logit_rows=True)
    ops = ops

    def __init__(self, cfg: LlamaConfig, device: str = "cpu"):
        super().__init__()
        check_supported(cfg)
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = Rope(cfg, device)
        self.threads = None  # a ThreadGovernor on the CPU (``torchpath.load``)
        self.packed_head: Any = None  # a PackedWeight once make_batch_invariant ran (not a submodule)
        self.quantized_head: Any = None  # an int4.QuantizedHead where the file's embedding multiplies as stored
        self.batch_invariant = False  # set by invariant.make_batch_invariant
        self.compiled: Any = None  # a compiled.CompiledStack where one was compiled for this model's shapes

    @classmethod
    def from_mlx(cls, mlx_model: Any, device: str = "cpu", dtype: str = "float32") -> Llama:
        if not hasattr(mlx_model, "cfg"):
            raise MlxspecError("the torch backend needs a family our llama module implements "
                               "(this model runs through mlx-lm's own class): use --backend mlx")
        model = cls(mlx_model.cfg, device)
        if dtype == "quantized":  # the file's 4-bit layers as stored, the rest float32 (torchpath.int4)
            if device != "cpu":
                raise MlxspecError(f"--dtype quantized runs on torch's CPU kernel; on {device} use bfloat16")
            layers, dense = int4.split_layers(mlx_model)
            int4.install(model, layers)
            _load(model, mlx_model, device, torch.float32, dense)
            if int4.QuantizedHead.takes(mlx_model):
                model.quantized_head = int4.QuantizedHead(mlx_model.model.embed_tokens)
        else:
            _load(model, mlx_model, device, DTYPES[dtype])
        return model

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def blocks(self, h: torch.Tensor, cache, mask, positions, num_layers: int | None = None,
               taps: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The blocks' output and the residual stream entering each block index in ``taps``
        (``core.model.Llama``'s ``return_hidden`` with block indices)."""
        threads = getattr(self, "threads", None)  # the draft model shares these blocks, not the governor
        if threads is not None:
            threads.tick()
        offset = cache[0].offset if cache else 0
        mask, positions = pass_inputs(h.shape[1], offset, mask, positions, h.device)
        cos, sin = self.rope.tables(positions, h.dtype)
        if self.compiled is not None and num_layers in (None, len(self.layers)) and self.compiled.takes(h, cache, mask):
            h, entering = self.compiled(h, cache, mask, cos, sin)
            return h, [(*entering, h)[i] for i in taps]
        layers = self.layers[:num_layers]
        tapped = []
        for i, (layer, c) in enumerate(zip(layers, cache or [None] * len(layers))):
            if i in taps:
                tapped.append(h)
            h = layer(h, mask, c, self.rope, cos, sin)
        return h, tapped + ([h] if len(layers) in taps else [])

    def head(self, h: torch.Tensor) -> torch.Tensor:
        if self.packed_head is not None:
            return self.packed_head(h)
        return h @ self.model.embed_tokens.weight.T if self.cfg.tie_embeddings else self.lm_head(h)

    def forward(self, tokens: torch.Tensor, cache: list[KVCache] | None, mask=None, positions=None,
                num_layers: int | None = None, return_hidden: bool | tuple[int, ...] = False,
                logit_rows: int | None = None):
        """``logit_rows``: the logits of the last n positions only (``Capabilities.logit_rows``):
        a prompt chunk's 512 rows through the 49,152-word head cost a fifth of prefill. With
        ``make_batch_invariant``'s head a row's logits have the same bits either way."""
        taps = tuple(sorted(set(return_hidden))) if isinstance(return_hidden, tuple) else ()
        h, tapped = self.blocks(self.model.embed_tokens(tokens.to(self.device)), cache, mask, positions, num_layers,
                                taps)
        h = self.model.norm(h)
        if logit_rows == 0:
            logits = h.new_empty((*h.shape[:-1], 0))  # nobody reads them
        else:
            logits = self.head(h if logit_rows is None else h[:, h.shape[1] - logit_rows:])
        if taps:
            return logits, torch.cat(tapped, dim=-1)
        return (logits, h) if return_hidden else logits


def teacher_outputs(model: Llama, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``training.features.teacher_pass`` on torch: for a (B, L) batch, the final normed hidden
    states (float16), the logsumexp of the full logits and their argmax (int32), as numpy."""
    with torch.inference_mode():
        logits, h = model(torch.from_numpy(batch.astype(np.int64)), None, return_hidden=True)
        lse, am = torch.logsumexp(logits.float(), dim=-1), logits.argmax(dim=-1)
        return h.half().cpu().numpy(), lse.cpu().numpy(), am.int().cpu().numpy()


def tapped_teacher_outputs(model: Llama, batch: np.ndarray, every: tuple[int, ...],
                           pick: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """``teacher_outputs`` tapping the blocks ``every`` (ascending, the last block's output
    last): the final normed hidden states, the taps at indices ``pick`` of ``every`` side by
    side (both float16), the logsumexp and the argmax."""
    with torch.inference_mode():
        logits, tapped = model(torch.from_numpy(batch.astype(np.int64)), None, return_hidden=every)
        parts = tapped.split(tapped.shape[-1] // len(every), dim=-1)
        h = model.model.norm(parts[-1])
        aux = torch.cat([parts[i] for i in pick], dim=-1)
        lse, am = torch.logsumexp(logits.float(), dim=-1), logits.argmax(dim=-1)
        return h.half().cpu().numpy(), aux.half().cpu().numpy(), lse.cpu().numpy(), am.int().cpu().numpy()


def _full_row(reduced: torch.Tensor, vocab_ids: torch.Tensor, vocab: int, fill: float = float("-inf")) -> torch.Tensor:
    """A reduced row (..., n) over ``vocab_ids`` -> the full vocabulary, ``fill`` elsewhere: -inf
    for logits, 0 for probabilities."""
    full = reduced.new_full((*reduced.shape[:-1], vocab), fill)
    full[..., vocab_ids] = reduced
    return full


def _reduced_twin(module: nn.Module, mlx_module: Any, target: Llama) -> nn.Module:
    """``module`` with the weights of ``mlx_module`` (a draft or head over ``vocab_ids``, part of
    the vocabulary), in the target's device and dtype."""
    _load(module, mlx_module, str(target.device), target.model.embed_tokens.weight.dtype)
    module.vocab_ids = torch.from_numpy(np.array(mlx_module.vocab_ids)).long().to(target.device)
    return module


class DraftModel(nn.Module):
    """``core.drafters.draft_model.DraftModel`` for torch: blocks on the target's embedding table, a head
    over a frequency-ranked subset; full-vocabulary logits, -inf outside it."""

    ops = ops

    def __init__(self, cfg: Any, target: Llama):
        super().__init__()
        self.cfg = cfg
        lc = cfg.llama_config()
        if cfg.hidden_size != cfg.target_hidden:
            self.embed_proj = nn.Linear(cfg.target_hidden, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([Block(lc) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.head_vocab, bias=False)
        self.rope = Rope(lc, str(target.device))
        self.target = [target]  # a list: not a submodule, its weights are the target's

    @classmethod
    def from_mlx(cls, draft: Any, target: Llama) -> DraftModel:
        return _reduced_twin(cls(draft.cfg, target), draft, target)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def forward(self, tokens, cache=None, mask=None, positions=None, num_layers=None) -> torch.Tensor:
        if num_layers is not None:
            raise MlxspecError("the trained draft runs all its layers")
        h = self.target[0].model.embed_tokens(tokens.to(self.lm_head.weight.device))
        if hasattr(self, "embed_proj"):
            h = self.embed_proj(h)
        threads = getattr(self, "threads", None)  # the draft model shares these blocks, not the governor
        if threads is not None:
            threads.tick()
        offset = cache[0].offset if cache else 0
        mask, positions = pass_inputs(h.shape[1], offset, mask, positions, h.device)
        cos, sin = self.rope.tables(positions, h.dtype)
        for layer, c in zip(self.layers, cache or [None] * len(self.layers)):
            h = layer(h, mask, c, self.rope, cos, sin)
        return _full_row(self.lm_head(self.norm(h)), self.vocab_ids, self.cfg.target_vocab)


class EagleHead(nn.Module):
    """``core.drafters.eagle.EagleHead`` for torch: (features, next tokens) -> (predicted next
    features, logits over ``vocab_ids``)."""

    ops = ops
    wants_hidden = True

    def __init__(self, cfg: Any, target: Llama):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.block = Block(cfg.block_config())
        self.lm_head = nn.Linear(d, cfg.head_vocab, bias=False)
        self.rope = Rope(cfg.block_config(), str(target.device))
        self.target = [target]

    @classmethod
    def from_mlx(cls, head: Any, target: Llama) -> EagleHead:
        return _reduced_twin(cls(head.cfg, target), head, target)

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def predict(self, features, tokens, cache=None, mask=None, positions=None) -> torch.Tensor:
        """The predicted next features only (training scores just the rows it trains on)."""
        e = self.target[0].model.embed_tokens(tokens.to(features.device)).to(features.dtype)
        h = self.fc(torch.cat([features, e], dim=-1))
        threads = getattr(self, "threads", None)  # the draft model shares these blocks, not the governor
        if threads is not None:
            threads.tick()
        offset = cache[0].offset if cache else 0
        mask, positions = pass_inputs(h.shape[1], offset, mask, positions, h.device)
        cos, sin = self.rope.tables(positions, h.dtype)
        return self.block(h, mask, None if cache is None else cache[0], self.rope, cos, sin)

    def logits(self, pred: torch.Tensor) -> torch.Tensor:
        return self.lm_head(pred)

    def forward(self, features, tokens, cache=None, mask=None, positions=None):
        pred = self.predict(features, tokens, cache, mask, positions)
        return pred, self.logits(pred)

    def full_logits(self, reduced: torch.Tensor) -> torch.Tensor:
        return _full_row(reduced, self.vocab_ids, self.cfg.target_vocab)

    def full_probs(self, reduced: torch.Tensor) -> torch.Tensor:
        return _full_row(reduced, self.vocab_ids, self.cfg.target_vocab, 0.0)


class Eagle3Layer(nn.Module):
    """``core.drafters.eagle3.Eagle3Layer`` for torch."""

    def __init__(self, cfg: Any):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Attention(cfg.attention_config())
        self.self_attn.o_proj = nn.Linear(cfg.num_heads * cfg.dims_per_head, d, bias=cfg.attention_bias)
        self.mlp = MLP(cfg.mlp_config())
        self.input_layernorm, self.hidden_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)

    def forward(self, embeds, hidden, mask, cache, rope: Rope, cos, sin) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        res = normed if self.norm_before_residual else hidden
        h = res + self.self_attn(torch.cat([self.input_layernorm(embeds), normed], dim=-1), mask, cache, rope, cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """``core.drafters.eagle3.Eagle3Head`` for torch: (features, next tokens) -> (the head's
    next feature, logits over its draft vocabulary)."""

    ops = ops

    def __init__(self, cfg: Any, target: Llama):
        super().__init__()
        self.cfg = cfg
        if cfg.own_embedding:
            self.embed_tokens = nn.Embedding(cfg.target_vocab, cfg.hidden_size)
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=cfg.fc_bias)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab, bias=False)
        self.rope = Rope(cfg.attention_config(), str(target.device))
        self.target = [target]

    @classmethod
    def from_mlx(cls, head: Any, target: Llama) -> Eagle3Head:
        return _reduced_twin(cls(head.cfg, target), head, target)

    @property
    def wants_hidden(self) -> tuple[int, ...]:
        return self.cfg.aux_layers

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def predict(self, features, tokens, cache=None, mask=None, positions=None) -> torch.Tensor:
        h = self.fc(features) if features.shape[-1] == self.cfg.fc_in else features
        table = self.embed_tokens if self.cfg.own_embedding else self.target[0].model.embed_tokens
        e = table(tokens.to(h.device)).to(h.dtype)
        offset = cache[0].offset if cache else 0
        mask, positions = pass_inputs(h.shape[1], offset, mask, positions, h.device)
        cos, sin = self.rope.tables(positions, h.dtype)
        return self.midlayer(e, h, mask, None if cache is None else cache[0], self.rope, cos, sin)

    def logits(self, pred: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(pred))

    def forward(self, features, tokens, cache=None, mask=None, positions=None):
        pred = self.predict(features, tokens, cache, mask, positions)
        return pred, self.logits(pred)

    def full_logits(self, reduced: torch.Tensor) -> torch.Tensor:
        return _full_row(reduced, self.vocab_ids, self.cfg.target_vocab)

    def full_probs(self, reduced: torch.Tensor) -> torch.Tensor:
        return _full_row(reduced, self.vocab_ids, self.cfg.target_vocab, 0.0)
