"""An EAGLE-3 draft head: the architecture of the published EAGLE-3 checkpoints (SafeAILab's
EAGLE, SpecForge, vLLM's ``speculators``), which vLLM and SGLang serve.

The target hands over the residual stream entering a few of its blocks (by default a low, a
middle and a high one: block indices 2, L/2 and L-3), concatenated. ``fc`` fuses them into the
head's width. One decoder layer then reads, at slot s, [normed embedding of x_{s+1}; normed
feature] (twice the head's width) and its output, before the final norm, is the feature the head
feeds itself at the next draft step (not passed through ``fc`` again: it already has the head's
width). ``norm`` and ``lm_head`` score a draft vocabulary, whose column c is target token
c + d2t[c]. Tokens outside it get q = 0, so verification stays exact.

Drafting, slots and rollback are the eagle drafter's (``eagle.EagleDrafter``): only what the
target returns (``wants_hidden``: the block indices) and how a feature becomes a prediction differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from mlxspec.core.drafters.eagle import DraftVocabHead
from mlxspec.core.model import Attention, LlamaConfig, MLP, Unowned, check_rope_scaling


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The block indices vLLM and SGLang tap when a head's config names none."""
    return (2, num_layers // 2, num_layers - 3)


def ids_from_d2t(d2t: mx.array) -> mx.array:
    """Target token ids of the draft vocabulary's columns: column c is c + d2t[c]."""
    return mx.arange(d2t.shape[0], dtype=mx.int64) + d2t.astype(mx.int64)


def d2t_from_ids(ids: mx.array) -> mx.array:
    """The published offset map (int64) of a draft vocabulary given as target ids per column."""
    return ids.astype(mx.int64) - mx.arange(ids.shape[0], dtype=mx.int64)


def t2d_from_ids(ids: mx.array, target_vocab: int) -> mx.array:
    """The published boolean mask over the target vocabulary: True where a column maps to it."""
    mask = mx.zeros((target_vocab,), dtype=mx.bool_)
    mask[ids.astype(mx.int32)] = True
    return mask


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int  # the head's own width (may differ from the target's)
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    draft_vocab: int
    target_vocab: int
    target_hidden: int
    aux_layers: tuple[int, ...]  # block indices of the target whose input the head reads, ascending
    head_dim: int | None = None  # None: hidden_size // num_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position: int = 2048
    norm_before_residual: bool = False  # speculators' variant: the residual is the normed feature
    attention_bias: bool = False
    mlp_bias: bool = False
    fc_bias: bool = False
    own_embedding: bool = False  # the checkpoint carries embed_tokens; else the target's are shared

    @property
    def fc_in(self) -> int:
        return len(self.aux_layers) * self.target_hidden

    @property
    def dims_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def attention_config(self) -> LlamaConfig:
        """The layer's attention as our llama module builds it: q/k/v read twice the width (the
        concatenated embedding and feature); ``Eagle3Layer`` gives o_proj the head's width back.
        The rotation is Hugging Face's (halves, not interleaved), as every published head uses."""
        return LlamaConfig(
            vocab_size=self.draft_vocab, hidden_size=2 * self.hidden_size, num_layers=1, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, rope_traditional=False,
            max_position=self.max_position, tie_embeddings=False, explicit_head_dim=self.dims_per_head,
            qkv_bias=self.attention_bias, o_bias=self.attention_bias, rope_scaling=self.rope_scaling,
        )

    def mlp_config(self) -> LlamaConfig:
        return replace(self.attention_config(), hidden_size=self.hidden_size, mlp_bias=self.mlp_bias)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "aux_layers": list(self.aux_layers)}


class Eagle3Layer(nn.Module):
    """The published ``midlayer``: attention over [input_layernorm(embedding);
    hidden_norm(feature)], the feature (normed or not, ``norm_before_residual``) as the
    residual, then the usual post-attention norm and SiLU MLP."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        check_rope_scaling(cfg.rope_scaling)
        self.self_attn = Attention(cfg.attention_config())
        self.self_attn.o_proj = nn.Linear(cfg.num_heads * cfg.dims_per_head, d, bias=cfg.attention_bias)
        self.mlp = MLP(cfg.mlp_config())
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.hidden_norm = nn.RMSNorm(d, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)

    def __call__(self, embeds: mx.array, hidden: mx.array, mask: Any, cache: KVCache | None,
                 positions: mx.array | None) -> mx.array:
        normed = self.hidden_norm(hidden)
        res = normed if self.norm_before_residual else hidden
        h = res + self.self_attn(mx.concatenate([self.input_layernorm(embeds), normed], axis=-1), mask, cache,
                                 positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(DraftVocabHead):
    """``head(features, tokens, cache)`` -> (the head's next feature, logits over its draft
    vocabulary). ``features`` (B, L, F) are the target's tapped states (F = ``cfg.fc_in``, fused
    by ``fc``) or the head's own earlier outputs (F = ``cfg.hidden_size``, read as they are: the
    width tells them apart, as in the public definition; a config where the two widths agree is
    refused when loaded). ``tokens`` (B, L) are x_{s+1}."""

    def __init__(self, cfg: Eagle3Config, vocab_ids: mx.array, embed: Callable[[mx.array], mx.array] | None = None):
        super().__init__()
        self.cfg = cfg
        if cfg.own_embedding:
            self.embed_tokens = nn.Embedding(cfg.target_vocab, cfg.hidden_size)
        elif embed is None:
            raise ValueError("an EAGLE-3 head without its own embedding table needs the target's")
        self._embed = Unowned(embed)
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=cfg.fc_bias)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab, bias=False)
        self._ids = Unowned(vocab_ids.astype(mx.int32))

    @property
    def wants_hidden(self) -> tuple[int, ...]:
        return self.cfg.aux_layers

    @property
    def vocab_ids(self) -> mx.array:
        return self._ids.value

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def embed(self, tokens: mx.array) -> mx.array:
        table = self.embed_tokens if self.cfg.own_embedding else self._embed.value
        return mx.stop_gradient(table(tokens))

    def predict(self, features: mx.array, tokens: mx.array, cache: list | None = None, mask: Any = None,
                positions: mx.array | None = None) -> mx.array:
        """The head's output feature (before ``norm``): what it reads at its next draft step."""
        if mask is None and tokens.shape[1] > 1:
            mask = "causal"
        h = self.fc(features) if features.shape[-1] == self.cfg.fc_in else features
        e = self.embed(tokens).astype(h.dtype)
        return self.midlayer(e, h, mask, None if cache is None else cache[0], positions)

    def logits(self, pred: mx.array) -> mx.array:
        return self.lm_head(self.norm(pred))

