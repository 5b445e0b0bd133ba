"""The project's own draft model: a few llama blocks on top of the target's embedding table,
with a reduced-vocabulary head (trained by ``training/``, stored by ``targets/folders.py``).

Only what the draft adds is stored: its blocks, final norm, head rows and the token ids those
rows stand for. The embedding table is the target's, attached at load time, so a 2-layer draft
for a 135M target is ~12M parameters instead of ~40M.

The head scores only ``head_vocab`` tokens (the most frequent in the training data). Every
other token gets logit -inf, i.e. q = 0: the rejection rule stays exact (the target's mass
there is simply never proposed) and the head costs a fraction of the full 49,152-row one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

from mlxspec.core.model import Block, LlamaConfig, Unowned
from mlxspec.errors import MlxspecError


@dataclass(frozen=True)
class DraftConfig:
    num_layers: int = 2
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_heads: int = 9
    num_kv_heads: int = 3
    head_vocab: int = 8192
    init: str = "target"  # "target": copy the target's first blocks, norm and head rows; "random"
    # Facts about the target the draft was built for, checked at load time.
    target_vocab: int = 49152
    target_hidden: int = 576
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    max_position: int = 8192
    tokenizer_sha256: str = ""

    def validate(self) -> None:
        if not 1 <= self.num_layers <= 4:
            raise MlxspecError(f"draft layers must be in 1..4, got {self.num_layers}")
        if self.hidden_size <= 0 or self.hidden_size % self.num_heads:
            raise MlxspecError(f"draft hidden size {self.hidden_size} must be a positive multiple of {self.num_heads} heads")
        if not 1 <= self.head_vocab <= self.target_vocab:
            raise MlxspecError(f"draft head vocabulary must be in 1..{self.target_vocab}, got {self.head_vocab}")
        if self.init not in ("target", "random"):
            raise MlxspecError(f"draft init must be 'target' or 'random', got {self.init!r}")
        if self.init == "target" and self.hidden_size != self.target_hidden:
            raise MlxspecError(
                f"--init target copies the target's blocks, so the hidden size must be the target's "
                f"({self.target_hidden}), got {self.hidden_size}; use --init random for another size")

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.head_vocab, hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_traditional=self.rope_traditional,
            max_position=self.max_position, tie_embeddings=False,
        )

    @classmethod
    def for_target(cls, target: LlamaConfig, tokenizer_sha256: str, **choices: Any) -> DraftConfig:
        """The target's shapes, overridden by the user's ``choices`` (layers, sizes, vocab)."""
        base = cls(
            hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
            num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
            head_vocab=min(cls.head_vocab, target.vocab_size),
            target_vocab=target.vocab_size, target_hidden=target.hidden_size,
            rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
            rope_traditional=target.rope_traditional, max_position=target.max_position,
            tokenizer_sha256=tokenizer_sha256,
        )
        cfg = replace(base, **{k: v for k, v in choices.items() if v is not None})
        cfg.validate()
        return cfg


class DraftModel(nn.Module):
    """``model(tokens, cache)`` -> full-vocabulary logits (-inf outside the head's ids), which
    is what the engine's ``ModelDrafter`` expects; ``reduced_logits`` is what training uses."""

    def __init__(self, cfg: DraftConfig, vocab_ids: mx.array, embed: Callable[[mx.array], mx.array]):
        super().__init__()
        cfg.validate()
        if vocab_ids.shape != (cfg.head_vocab,):
            raise MlxspecError(f"draft head has {cfg.head_vocab} rows but {vocab_ids.shape[0]} vocabulary ids")
        self.cfg = cfg
        lc = cfg.llama_config()
        if cfg.hidden_size != cfg.target_hidden:
            self.embed_proj = nn.Linear(cfg.target_hidden, cfg.hidden_size, bias=False)
        self.layers = [Block(lc) for _ in range(cfg.num_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.head_vocab, bias=False)
        self._ids = Unowned(vocab_ids.astype(mx.int32))
        self._embed = Unowned(embed)

    @property
    def vocab_ids(self) -> mx.array:
        return self._ids.value

    @property
    def embed(self) -> Callable[[mx.array], mx.array]:
        """The target's embedding the draft reads (shared, so neither trained nor saved)."""
        return self._embed.value

    def make_cache(self) -> list:
        return [KVCache() for _ in self.layers]

    def reduced_logits(self, tokens: mx.array, cache: list | None = None, mask: Any = None,
                       positions: mx.array | None = None) -> mx.array:
        """(B, L) tokens -> (B, L, head_vocab) logits over ``vocab_ids``; ``mask`` and
        ``positions`` as in our llama module (tree drafting)."""
        if mask is None and tokens.shape[1] > 1:
            mask = "causal"
        h = mx.stop_gradient(self._embed.value(tokens))
        if "embed_proj" in self:
            h = self.embed_proj(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, mask, None if cache is None else cache[i], positions)
        return self.lm_head(self.norm(h))

    def __call__(self, tokens: mx.array, cache: list | None = None, mask: Any = None,
                 positions: mx.array | None = None, num_layers: int | None = None) -> mx.array:
        if num_layers is not None:
            raise MlxspecError("the trained draft runs all its layers")
        z = self.reduced_logits(tokens, cache, mask, positions)
        full = mx.full((*z.shape[:-1], self.cfg.target_vocab), -mx.inf, dtype=z.dtype)
        full[..., self.vocab_ids] = z
        return full

    def num_params(self) -> int:
        """Parameters the draft owns (the shared embedding table is not among them)."""
        return sum(v.size for _, v in tree_flatten(self.parameters()))
