"""What a client asks of ``mlxspec serve``: the server's options and one generation request,
parsed and checked as OpenAI's API shapes them. Pure: tested without a model."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, fields, replace
from typing import Any

from mlxspec.core.sampling import MAX_TOP_LOGPROBS, SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.serve.access import Access
from mlxspec.session import SessionOptions

MAX_STOPS = 4  # as OpenAI's API
MAX_ID_DIGITS = 12
# Conversations kept between requests, and the memory they may hold: mlx-lm's server keeps 10;
# 2 GB holds 10 conversations of 4k tokens of the default model's float32 cache (46 kB a token).
PROMPT_CACHE_SIZE = 10
PROMPT_CACHE_BYTES = 2 * 10**9
CHAT, TEXT = "chat", "text"  # the two generation endpoints


DEFAULT_PARALLEL = 8  # benchmarks/parallel_clients.py: 8 clients in 0.38x the time of one after another (4 slots: 0.47x, 16: 0.37x)
MAX_PARALLEL = 16  # a round's verify passes still fit one packed pass (``torchpath.packed.MAX_ROWS``)


@dataclass(frozen=True)
class Capacity:
    """What ``serve`` holds at once (``--parallel``, ``--prompt-cache-size/-bytes``)."""

    prompt_cache_size: int
    prompt_cache_bytes: int
    parallel: int | None


@dataclass(frozen=True)
class ServeOptions:
    """What ``mlxspec serve`` was started with; the sampling values are request defaults."""

    model: str = "default"
    draft: str = "none"
    k: int | str | None = None  # as ``--k``: None (auto with a drafter), an int or "auto"
    sampling: SamplingParams = SamplingParams()  # a request's own fields win, one by one
    max_tokens: int = 256
    dtype: str = "auto"
    remeasure_cost: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    tree: Any = None  # a ``TreeShape`` (--tree): every request drafts trees of it
    backend: str = "mlx"  # or "torch[:DEVICE]" (--backend, --device)
    prompt_cache_size: int = PROMPT_CACHE_SIZE  # conversations kept (--prompt-cache-size)
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES  # their memory at most (--prompt-cache-bytes)
    access: Access = Access()  # --api-key, --allowed-origins
    parallel: int | None = None  # requests decoded together (--parallel; None: DEFAULT_PARALLEL on torch, 1 on MLX)

    @property
    def session(self) -> SessionOptions:
        return SessionOptions(self.model, self.dtype, self.backend, self.draft, self.k, self.tree, self.remeasure_cost,
                              self.prompt_cache_size, self.prompt_cache_bytes)


@dataclass(frozen=True)
class GenerationRequest:
    """One parsed ``/v1/chat/completions`` (``kind`` CHAT) or ``/v1/completions`` (TEXT) body."""

    kind: str
    prompt: str | list[dict[str, str]] | list[int]  # text, chat messages, or token ids
    params: SamplingParams
    max_tokens: int
    seed: int
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    token_status: bool = False
    logprobs: int | None = None  # None: none reported; N: each token's, with N alternatives


class ApiError(Exception):
    """A request the server refuses, as OpenAI shapes it: an HTTP status and ``{"error": ...}``."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind
        self.headers = headers or {}  # e.g. ``Allow`` with a 405

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}


def parse_json(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    return body


def check_model(body: dict, names: frozenset[str]) -> None:
    """The server serves one model: accept its names (and a request that names none)."""
    name = body.get("model")
    if name is not None and name not in names:
        served = ", ".join(sorted(names))
        raise ApiError(404, f"the model {name!r} does not exist here; this server serves: {served}",
                       "model_not_found")


# Fields of OpenAI's and mlx-lm's APIs this server does not implement: accepted only at the value
# that changes nothing (what clients send by default), refused otherwise rather than ignored.
NEUTRAL: dict[str, tuple] = {
    "echo": (False,), "best_of": (1,), "suffix": ("",),
    "tools": ([],), "tool_choice": ("none",), "parallel_tool_calls": (False, True), "functions": ([],),
    "response_format": ({"type": "text"},), "modalities": (["text"],),
}
IGNORED = {"user", "metadata", "store", "service_tier", "stream_options", "reasoning_effort"}  # no effect on output
# The sampling fields are ``SamplingParams``' own, named as OpenAI's API (temperature, top_p,
# presence and frequency penalties, logit_bias) and mlx-lm's server (top_k, min_p,
# repetition_penalty and the *_context_size windows) name them.
# ``coupled`` is ours: with a seed, the reply is target-only sampling's whatever the drafter.
SAMPLING = {f.name: {"int": int, "bool": bool}.get(str(f.type), float) for f in fields(SamplingParams)
            if f.name != "logit_bias"}
READ = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "stream", "stop", "seed",
        "mlxspec", "logprobs", "top_logprobs", "logit_bias"} | set(SAMPLING)
ROLES = ("system", "user", "assistant", "developer")
EXTENSION = {"token_status"}  # the fields of a request's "mlxspec" block


def parse_generation(kind: str, body: dict, options: ServeOptions, names: frozenset[str]) -> GenerationRequest:
    """A chat or text completion request, checked; absent sampling fields take the server's
    defaults. A field this server does not implement is refused unless its value changes nothing."""
    check_model(body, names)
    _check_fields(body, kind)
    prompt = _messages(body) if kind == CHAT else _text_prompt(body)
    if _field(body, "n", int, 1) != 1:
        raise ApiError(400, "only n=1 is supported", "unsupported_value")
    max_tokens = _field(body, "max_completion_tokens", int, None)
    max_tokens = _field(body, "max_tokens", int, options.max_tokens) if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be >= 1, got {max_tokens}", "invalid_value")
    try:
        params = _sampling(body, options.sampling)
    except MlxspecError as e:
        raise ApiError(400, str(e), "invalid_value") from None
    seed = _field(body, "seed", int, None)
    extension = _field(body, "mlxspec", dict, {})
    if unknown := sorted(set(extension) - EXTENSION):
        raise ApiError(400, f"unknown field mlxspec.{unknown[0]}; the mlxspec block takes {', '.join(sorted(EXTENSION))}",
                       "unknown_parameter")
    stream_options = _field(body, "stream_options", dict, {})
    return GenerationRequest(
        kind, prompt, params, max_tokens,
        # Like OpenAI: no seed, a fresh draw. MLX keys take an unsigned 64-bit seed; fold any int in.
        secrets.randbelow(2**31) if seed is None else seed % 2**64,
        _stops(body.get("stop")), _field(body, "stream", bool, False),
        bool(stream_options.get("include_usage", False)), _field(extension, "token_status", bool, False),
        _logprobs(body, kind))


def _sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    """The request's sampling: each field it gives, the server's ``defaults`` for the others
    (ranges are checked by ``SamplingParams``)."""
    values = {name: _field(body, name, kind, getattr(defaults, name)) for name, kind in SAMPLING.items()}
    if values["repetition_penalty"] == 0:  # mlx-lm's server sends 0 for "none" (a factor of 0 would divide by 0)
        values["repetition_penalty"] = 1.0
    bias = _field(body, "logit_bias", dict, None)
    return replace(defaults, **values, **({} if bias is None else {"logit_bias": _logit_bias(bias)}))


def _logit_bias(bias: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` (ids as JSON keys are strings) as (id, bias) pairs; the
    ids' range against the vocabulary is checked once the model is known (``check_bias_ids``)."""
    out = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ApiError(400, f"logit_bias keys must be token ids (decimal integers >= 0), got {key!r}", "invalid_value")
        if len(key) > MAX_ID_DIGITS:  # no vocabulary is that large (and int() refuses 4,300 digits)
            raise ApiError(400, f"logit_bias token id {key[:MAX_ID_DIGITS]}... is outside the vocabulary",
                           "invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(400, f"logit_bias[{key!r}] must be a number, got {value!r}", "invalid_type")
        out.append((int(key), float(value)))
    if len({t for t, _ in out}) != len(out):  # "05" and "5"
        raise ApiError(400, "logit_bias names a token id twice", "invalid_value")
    return tuple(out)


def _logprobs(body: dict, kind: str) -> int | None:
    """How many alternatives to report with each token's log-probability, None for none. Chat:
    ``logprobs`` true/false and ``top_logprobs`` 0..20 (OpenAI's). Completions: OpenAI's
    ``logprobs`` as the count, or mlx-lm's server's true/false with ``top_logprobs``."""
    value = body.get("logprobs")
    if kind == TEXT and isinstance(value, int) and not isinstance(value, bool):  # OpenAI's completions: a count
        if body.get("top_logprobs") is not None:
            raise ApiError(400, "give logprobs as a count or top_logprobs, not both", "invalid_value")
        if not 0 <= value <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {value}", "invalid_value")
        return value
    on, top = _field(body, "logprobs", bool, False), _field(body, "top_logprobs", int, None)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top}", "invalid_value")
    if top and not on:
        raise ApiError(400, "top_logprobs needs logprobs: true", "invalid_value")
    return (top or 0) if on else None


def check_bias_ids(req: GenerationRequest, vocab_size: int) -> None:
    """A logit bias for a token the model does not have is the client's error, as a prompt id is."""
    bad = next((t for t, _ in req.params.logit_bias if t >= vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"logit_bias token id {bad} is outside the vocabulary (0..{vocab_size - 1})",
                       "invalid_value")


def _check_fields(body: dict, kind: str) -> None:
    other = "prompt" if kind == "chat" else "messages"
    for name, value in body.items():
        if name in NEUTRAL:
            if value is not None and value not in NEUTRAL[name]:
                raise ApiError(400, f"{name}={value!r} is not supported by this server (it would be ignored); "
                               "drop it or send its neutral value", "unsupported_parameter")
        elif name == other or name not in READ | IGNORED:
            raise ApiError(400, f"unrecognized request argument: {name}", "unknown_parameter")


_JSON_TYPES = {bool: "a boolean", int: "an integer", float: "a number", dict: "an object"}


def _field(body: dict, name: str, kind: type, default: Any) -> Any:
    """``body[name]`` of JSON type ``kind`` (an int passes as a float; a bool never as a number),
    ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    ok = (isinstance(value, bool) if kind is bool
          else isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
          else isinstance(value, int) and not isinstance(value, bool) if kind is int
          else isinstance(value, kind))
    if not ok:
        raise ApiError(400, f"{name} must be {_JSON_TYPES[kind]}, got {value!r}", "invalid_type")
    return float(value) if kind is float else value


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content}", "missing_messages")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(m: Any, i: int) -> dict[str, str]:
    """One chat message with its content as text (a list of text parts is joined)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, f"messages[{i}] must be an object with a string role", "invalid_messages")
    if m["role"] not in ROLES:
        raise ApiError(400, f"messages[{i}].role {m['role']!r} is not one of {', '.join(ROLES)}", "invalid_messages")
    content = m.get("content")
    if content is None:
        raise ApiError(400, f"messages[{i}] has no content", "invalid_messages")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ApiError(400, f"messages[{i}]: only text content parts are supported", "invalid_messages")
        content = "".join(p["text"] for p in content)
    elif not isinstance(content, str):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                       "invalid_messages")
    return {"role": m["role"], "content": content}


def _text_prompt(body: dict) -> str | list[int]:
    """A completion prompt: a string or token ids, one prompt per request."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be one non-empty string or one list of token ids", "missing_prompt")


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop must be a string or a list of up to {MAX_STOPS} strings", "invalid_stop")
    return tuple(s for s in stops if s)

