"""The JSON objects of a response, whole or streamed as chunks, in OpenAI's shapes plus
``speculation`` (and, on request, each token's status)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from mlxspec.serve.decoder import ModelInfo
from mlxspec.serve.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from mlxspec.serve.reply import Delta, Reply
from mlxspec.serve.requests import CHAT, TEXT, GenerationRequest


@dataclass(frozen=True)
class ResponseMeta:
    """What every object of one response shares."""

    kind: str
    id: str
    model: str
    created: int

    @staticmethod
    def new(kind: str, model: str) -> ResponseMeta:
        prefix = "chatcmpl" if kind == CHAT else "cmpl"
        return ResponseMeta(kind, f"{prefix}-{uuid.uuid4().hex[:24]}", model, int(time.time()))

    def envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == CHAT else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


def choice(kind: str, text: str, finish: str | None, chunk: bool, role: bool = False,
           logprobs: list[TokenLogprob] | None = None) -> dict:
    """One choice: a chat message (or a chunk's delta) or a text completion's text, with the
    tokens' ``logprobs`` when the request asked for them (None otherwise)."""
    shaped = None if logprobs is None else (chat_logprobs if kind == CHAT else completion_logprobs)(logprobs)
    if kind == TEXT:
        return {"index": 0, "text": text, "logprobs": shaped, "finish_reason": finish}
    if not chunk:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": shaped,
                "finish_reason": finish}
    delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})
    return {"index": 0, "delta": delta, "logprobs": shaped, "finish_reason": finish}


def full_response(meta: ResponseMeta, text: str, reply: Reply, info: ModelInfo, tokens: list[dict] | None,
                  logprobs: list[TokenLogprob] | None = None) -> dict:
    """The whole reply; ``logprobs``: every reported token's, when the request asked for them."""
    out = meta.envelope([choice(meta.kind, text, reply.finish_reason, chunk=False, logprobs=logprobs)], chunk=False)
    out["usage"] = reply.tally.usage()
    out["speculation"] = reply.tally.speculation(info.drafter, info.k)
    if tokens is not None:
        out["mlxspec"] = {"tokens": tokens}
    return out


def stream_chunks(meta: ResponseMeta, req: GenerationRequest, deltas: Iterator[Delta], reply: Reply,
                  info: ModelInfo) -> Iterator[dict]:
    """The streamed objects of one reply. The chunk with ``finish_reason`` carries ``usage`` and
    ``speculation``, unless ``stream_options.include_usage`` asks for OpenAI's own last chunk
    (no choices, ``usage``); then that one carries them."""
    if meta.kind == CHAT:
        yield meta.envelope([choice(CHAT, "", None, chunk=True, role=True)], chunk=True)
    wanted = req.logprobs is not None
    for d in deltas:
        if d.text or (req.token_status and d.tokens) or (wanted and d.logprobs):
            out = meta.envelope([choice(meta.kind, d.text, None, chunk=True,
                                        logprobs=d.logprobs if wanted else None)], chunk=True)
            if req.token_status:
                out["mlxspec"] = {"tokens": d.tokens}
            yield out
    last = meta.envelope([choice(meta.kind, "", reply.finish_reason, chunk=True)], chunk=True)
    stats = {"usage": reply.tally.usage(), "speculation": reply.tally.speculation(info.drafter, info.k)}
    if req.include_usage:
        yield last
        yield meta.envelope([], chunk=True) | stats
    else:
        yield last | stats

