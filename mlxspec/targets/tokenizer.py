"""Tokenizers: rebuilt from GGUF metadata, or taken from an mlx-lm / Hugging Face folder.

Either way the result is mlx-lm's ``TokenizerWrapper`` around a Hugging Face fast tokenizer, so
chat templates, streaming detokenisation and mlx-lm's own generators all work on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mlxspec.errors import MlxspecError

# GGUF token types (llama.cpp's llama_token_type): 3 = control, 4 = user-defined.
_SPECIAL_TYPES = (3, 4)
# Turn or document terminators we stop on besides the declared EOS.
_STOP_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")


def _scalar(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    v = meta.get(key, default)
    return v.item() if hasattr(v, "item") else v


def _gguf_splits() -> dict[str, str]:
    """transformers' table of llama.cpp's pre-tokenizer regexes by GGUF name (llama3, qwen2,
    tekken, ...), where this transformers has it."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return {}
    return GGUF_PRE_TOKENIZER_SPLITS


def pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """How text is split before BPE, as the vocabulary's merges were learned: llama3 keeps
    digits in threes, qwen2 and smollm one by one; GPT-2's regex otherwise."""
    split = _gguf_splits().get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "deepseek-llm"):  # GPT-2's regex with every digit its own pre-token
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def tokenizer_from_gguf(meta: dict[str, Any]) -> TokenizerWrapper:
    """GPT-2 style byte-level BPE from ``tokenizer.ggml.*`` metadata."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise MlxspecError(
            f"unsupported GGUF tokenizer model {kind!r}; supported: 'gpt2' (byte-level BPE)"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = np.array(meta["tokenizer.ggml.token_type"]) if "tokenizer.ggml.token_type" in meta else None

    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizer(_scalar(meta, "tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()

    special = [tokens[i] for i in np.flatnonzero(np.isin(types, _SPECIAL_TYPES))] if types is not None else []
    tok.add_special_tokens(special)

    def name(key: str) -> str | None:
        i = _scalar(meta, key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name("tokenizer.ggml.bos_token_id"),
        eos_token=name("tokenizer.ggml.eos_token_id"),
        unk_token=name("tokenizer.ggml.unknown_token_id"),
        pad_token=name("tokenizer.ggml.padding_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
    )
    eos = {hf.eos_token_id} | {hf.convert_tokens_to_ids(s) for s in _STOP_NAMES if s in special}
    return TokenizerWrapper(hf, eos_token_ids=sorted(i for i in eos if i is not None))


def stop_token_ids(tokenizer: TokenizerWrapper) -> set[int]:
    return set(tokenizer.eos_token_ids)


def has_chat_template(tokenizer: TokenizerWrapper) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: TokenizerWrapper, prompt: str | list[dict], raw: bool = False) -> list[int]:
    """Token ids for a prompt: a user message (or a message list) through the chat template,
    or the text as is with ``raw`` or when the model has no template."""
    if isinstance(prompt, list):
        messages = prompt
    elif raw or not has_chat_template(tokenizer):
        return tokenizer.encode(prompt, add_special_tokens=False)
    else:
        messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def check_compatible(target: TokenizerWrapper, draft: TokenizerWrapper) -> None:
    """Same tokenizer content (not the same embedding size: mlx-community pairs pad their
    tables differently). Fails naming the first token id where they differ."""
    tv, dv = target._tokenizer.get_vocab(), draft._tokenizer.get_vocab()
    if tv == dv:
        return
    t_by_id = {i: t for t, i in tv.items()}
    d_by_id = {i: t for t, i in dv.items()}
    for i in sorted(set(t_by_id) | set(d_by_id)):
        if t_by_id.get(i) != d_by_id.get(i):
            raise MlxspecError(
                f"draft and target tokenizers differ at id {i}: target {t_by_id.get(i)!r}, "
                f"draft {d_by_id.get(i)!r} ({len(tv)} vs {len(dv)} tokens)"
            )
