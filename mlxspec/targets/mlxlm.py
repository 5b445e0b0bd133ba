"""Any architecture mlx-lm can load, behind the target seam, for chain speculation.

Our llama module implements the families it knows with explicit masks, positions, partial
layers and hidden states. Everything else mlx-lm implements runs through mlx-lm's own model
class here: the model builds its own causal mask from the cache offset, so this target verifies
chains only, and says so for every feature it lacks (trees, ``self:L``, heads that read the
target's features, trained drafts that share its embedding table).

Caches. Speculation appends drafts to every layer's cache and cuts the rejected ones off again:

* a sliding-window layer's ``RotatingKVCache`` cannot be cut once it has wrapped (it overwrote
  the slots the rejected drafts took), so it is replaced by ``WindowedKVCache``: every key is
  kept and the keys that left the window are hidden by the mask. Exact at any length; memory
  grows with the context like a full-attention layer's.
* recurrent state (``ArraysCache``, Mamba-style) has no per-token history to cut: target-only
  decoding runs, speculation is refused by ``core.cache.check_trimmable``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm.models.cache import (
    CacheList,
    KVCache,
    RotatingKVCache,
    create_attention_mask,
    make_prompt_cache,
)
from mlx_lm.utils import _get_classes, dequantize_model, load_model, load_tokenizer

from mlxspec.core.target import Capabilities
from mlxspec.errors import MlxspecError
from mlxspec.targets.families import FAMILIES
from mlxspec.targets.weights import FLOAT_DTYPES

# Where configs keep the context length, most common first.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")
DEFAULT_CONTEXT = 4096  # as our own loader assumes when a config names none


@dataclass(frozen=True)
class MlxLmConfig:
    """What the rest of mlxspec reads of a target's config (``LoadedModel.config``)."""

    model_type: str
    vocab_size: int
    num_layers: int
    hidden_size: int | None
    max_position: int
    tie_embeddings: bool


def native_families() -> str:
    """The model types our own module runs, with every feature."""
    return ", ".join(FAMILIES)


def needs_family(model_type: str, feature: str) -> MlxspecError:
    """The one-line error for a feature a model run through mlx-lm's class lacks."""
    return MlxspecError(
        f"{feature} needs a model family mlxspec implements itself ({native_families()}); "
        f"this {model_type} model runs through mlx-lm's own class: chain speculation only, "
        "with --draft ngram:N or a draft model folder"
    )


class WindowedKVCache(KVCache):
    """A sliding-window layer's cache that can always be rolled back: it keeps every key, and
    its mask hides the ones older than the window, which mlx-lm's rotating buffer would have
    dropped. mlx-lm's models build a sliding layer's mask from that layer's cache (passing the
    window, or leaving the rotating cache to supply it), so the mask answers for both."""

    def __init__(self, window: int):
        super().__init__()
        self.window = window

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False) -> Any:
        window = window_size or self.window
        if self.offset + N <= window:  # no key has left the window yet: the plain causal mask
            window = None
        return create_attention_mask(N, offset=self.offset, return_array=return_array, window_size=window)


def _rollbackable(cache: Any) -> Any:
    """``cache`` with every rotating sliding-window cache swapped for a ``WindowedKVCache``.
    A rotating cache that pins its first tokens (``keep``: attention sinks) is left as it is:
    it is not a plain window, and ``check_trimmable`` refuses it for speculation."""
    if isinstance(cache, RotatingKVCache) and cache.keep == 0:
        return WindowedKVCache(cache.max_size)
    if isinstance(cache, CacheList):
        cache.caches = tuple(_rollbackable(c) for c in cache.caches)
    return cache


class MlxLmTarget:
    """An mlx-lm model (``mlx_lm.utils.load_model`` or a model class built directly) as a
    ``Target``: logits for a chain of tokens on its own cache, nothing more."""

    capabilities = Capabilities()  # no explicit masks or positions, no partial layers, no hidden states

    def __init__(self, module: nn.Module, config: dict[str, Any] | None = None):
        self.module = module
        self.cfg = _config(module, config or {})

    @property
    def layers(self) -> list[nn.Module]:
        return self.module.layers

    def parameters(self) -> dict[str, Any]:
        """The wrapped model's parameters, under its own names."""
        return self.module.parameters()

    def cpu_path(self) -> None:
        """mlx-lm's forward has no alternative CPU path to profile (see ``measure.profile``)."""

    def make_cache(self) -> list[Any]:
        return [_rollbackable(c) for c in make_prompt_cache(self.module)]

    def __call__(
        self,
        tokens: mx.array,
        cache: list[Any] | None,
        mask: mx.array | str | None = None,
        positions: mx.array | None = None,
        num_layers: int | None = None,
        return_hidden: bool = False,
    ) -> mx.array:
        self._refuse(mask, positions, num_layers, return_hidden)
        return self.module(tokens, cache=cache)

    def _refuse(self, mask: Any, positions: Any, num_layers: int | None, return_hidden: bool) -> None:
        """Fail on anything but a plain causal chain: the model would silently ignore it."""
        mt = self.cfg.model_type
        if (mask is not None and not (isinstance(mask, str) and mask == "causal")) or positions is not None:
            raise needs_family(mt, "tree verification (an explicit attention mask and positions)")
        if num_layers is not None and num_layers != self.cfg.num_layers:
            raise needs_family(mt, "running the first L layers only (self:L)")
        if return_hidden:
            raise needs_family(mt, "returning the target's hidden states (eagle heads)")


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The first of ``keys`` set in ``config`` or its ``text_config`` (multimodal wrappers)."""
    for scope in (config, config.get("text_config") or {}):
        for k in keys:
            if scope.get(k) is not None:
                return scope[k]
    return None


def _vocab_size(module: nn.Module, config: dict[str, Any]) -> int:
    args = getattr(module, "args", None)
    n = getattr(args, "vocab_size", None) or _first(config, ("vocab_size", "n_vocab", "padded_vocab_size"))
    if n:
        return int(n)
    # A config that names none: the head's width is the vocabulary the engine samples from.
    return int(module(mx.array([[0]]), cache=make_prompt_cache(module)).shape[-1])


def _tied(module: nn.Module) -> bool:
    tied = getattr(module, "tie_word_embeddings", getattr(getattr(module, "args", None), "tie_word_embeddings", None))
    return bool(tied) if isinstance(tied, bool) else "lm_head" not in module


def _config(module: nn.Module, config: dict[str, Any]) -> MlxLmConfig:
    args = getattr(module, "args", None)
    hidden = getattr(args, "hidden_size", None) or _first(config, ("hidden_size", "n_embd", "d_model"))
    return MlxLmConfig(
        model_type=str(config.get("model_type") or getattr(module, "model_type", None)
                       or getattr(args, "model_type", "unknown")),
        vocab_size=_vocab_size(module, config),
        num_layers=len(module.layers),
        hidden_size=int(hidden) if isinstance(hidden, int) else None,
        max_position=int(_first(config, _CONTEXT_KEYS) or DEFAULT_CONTEXT),
        tie_embeddings=_tied(module),
    )


def knows(config: dict[str, Any]) -> bool:
    """Whether this mlx-lm has a model class for ``config`` (its own remapping included)."""
    try:
        _get_classes(config)
    except (ValueError, KeyError):
        return False
    return True


def unsupported(model_type: Any) -> MlxspecError:
    """Neither our module nor mlx-lm implements ``model_type``: one line saying what does."""
    return MlxspecError(
        f"unsupported architecture {model_type!r}; supported: {native_families()} (every feature), "
        f"or any model type mlx-lm {mlx_lm.__version__} implements (chain speculation only)"
    )


def _cast(module: nn.Module, dtype: str) -> None:
    """Weights in ``dtype``: a float format dequantizes what the folder stores quantized;
    ``quantized`` keeps the folder's own format, as our loader does."""
    if dtype == "quantized":
        return
    if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for m in module.modules()):
        dequantize_model(module)
    module.set_dtype(FLOAT_DTYPES[dtype])


def load_folder(path: Path, dtype: str) -> tuple[MlxLmTarget, Any, int]:
    """An mlx-lm folder of an architecture only mlx-lm implements: (target, tokenizer, context).
    ``dtype`` is resolved already (no ``auto``)."""
    config = json.loads((path / "config.json").read_text())
    if not knows(config):
        raise unsupported(config.get("model_type"))
    if not list(path.glob("model*.safetensors")):
        raise MlxspecError(f"{path} has no model*.safetensors weights")
    try:
        module, config = load_model(path, lazy=True)
    except (ValueError, KeyError, TypeError, FileNotFoundError) as err:
        raise MlxspecError(f"{path}: mlx-lm cannot load this {config.get('model_type')} model: {err}") from None
    _cast(module, dtype)
    mx.eval(module.parameters())
    target = MlxLmTarget(module, config)
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return target, tokenizer, target.cfg.max_position


def require_native(lm: Any, feature: str) -> None:
    """Fail when ``lm`` (a ``LoadedModel``) runs through mlx-lm's class: ``feature`` (training,
    trained drafts) reads our module's internals (its embedding table, its config)."""
    model = getattr(lm, "model", None)
    if isinstance(model, MlxLmTarget):
        raise needs_family(model.cfg.model_type, feature)
