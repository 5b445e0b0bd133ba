"""Reported log-probabilities in OpenAI's reply shapes. The values are the engine's (``Token.logprob``:
the target's log-softmax of the processed logits at each emitted token, from the verify pass, so the
same with or without a drafter). Pure: tested without a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlxspec.core.events import Token


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's report: its text alone, its log-probability, the alternatives' texts
    and log-probabilities (best first, empty unless asked for), and where its text starts in the
    reply (characters before it)."""

    text: str
    logprob: float
    top: tuple[tuple[str, float], ...]
    offset: int


def token_logprobs(tokens: list[Token], pieces: list[str], decode: Callable[[int], str],
                   offset: int) -> list[TokenLogprob]:
    """The reports of a step's emitted tokens that carry a log-probability; ``pieces``: the text
    each emitted token added to the reply (the streaming detokeniser's), ``offset``: the reply's
    length before the step."""
    out = []
    for tok, piece in zip((t for t in tokens if t.emitted), pieces):
        if tok.logprob is not None:
            top = tuple((decode(i), lp) for i, lp in tok.top_logprobs or ())
            out.append(TokenLogprob(decode(tok.id), tok.logprob, top, offset))
        offset += len(piece)
    return out


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8", "replace"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """A chat choice's ``logprobs``: ``content``, one object per token."""
    return {"content": [{"token": e.text, "logprob": e.logprob, "bytes": _utf8(e.text),
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": _utf8(t)} for t, lp in e.top]}
                        for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob]) -> dict:
    """A text completion choice's ``logprobs`` (OpenAI's legacy shape: parallel lists, and each
    position's alternatives as a text -> log-probability object)."""
    return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries], "text_offset": [e.offset for e in entries]}
