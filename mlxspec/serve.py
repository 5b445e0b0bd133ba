"""``mlxspec serve``: an OpenAI-compatible HTTP server over the same engine as ``generate``.

I/O lives at the edge. Parsing a request, scanning for stop strings, counting usage and shaping
responses are pure (tested without a model); one ``Decoder`` thread runs every MLX call and takes
requests from a queue one at a time, and ``http.server`` handler threads only read requests,
tokenise, detokenise and write.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (both also
with ``stream: true`` as server-sent events). Next to ``usage`` every response carries
``speculation``, counted from the engine's events; a request with ``"mlxspec": {"token_status":
true}`` also gets each token with its status (accepted, rejected, corrected, bonus, plain).
"""

from __future__ import annotations

import json
import queue
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)
from mlxspec.core.ops import ops_for
from mlxspec.core.events import Done, Event, Status, Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import RunCollector
from mlxspec.session import Session, SessionOptions, StepText
from mlxspec.targets.costcurve import stderr_line

MAX_BODY_BYTES = 8 << 20  # far above any prompt that fits the context; refuses runaway uploads
MAX_STOPS = 4  # as OpenAI's API
CHAT, TEXT = "chat", "text"  # the two generation endpoints

Log = Callable[[str], None]


# --- options and requests --------------------------------------------------------------------


@dataclass(frozen=True)
class ServeOptions:
    """What ``mlxspec serve`` was started with; the sampling values are request defaults."""

    model: str = "default"
    draft: str = "none"
    k: int | str | None = None  # as ``--k``: None (auto with a drafter), an int or "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    dtype: str = "auto"
    remeasure_cost: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    tree: Any = None  # a ``TreeShape`` (--tree): every request drafts trees of it
    backend: str = "mlx"  # or "torch[:DEVICE]" (--backend, --device)

    @property
    def session(self) -> SessionOptions:
        return SessionOptions(self.model, self.dtype, self.backend, self.draft, self.k, self.tree, self.remeasure_cost)


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


class ApiError(Exception):
    """A request the server refuses, as OpenAI shapes it: an HTTP status and ``{"error": ...}``."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind

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


def parse_generation(kind: str, body: dict, options: ServeOptions, names: frozenset[str]) -> GenerationRequest:
    """A chat or text completion request, checked; absent sampling fields take the server's
    defaults. Fields this server does not implement (tools, logprobs, penalties) are ignored."""
    check_model(body, names)
    prompt = _messages(body) if kind == CHAT else _text_prompt(body)
    if _field(body, "n", int, 1) != 1:
        raise ApiError(400, "only n=1 is supported", "unsupported_value")
    max_tokens = _field(body, "max_completion_tokens", int, None)
    max_tokens = _field(body, "max_tokens", int, options.max_tokens) if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be >= 1, got {max_tokens}", "invalid_value")
    try:
        params = SamplingParams(_field(body, "temperature", float, options.temperature),
                                _field(body, "top_p", float, options.top_p))
    except MlxspecError as e:
        raise ApiError(400, str(e), "invalid_value") from None
    seed = _field(body, "seed", int, None)
    extension = _field(body, "mlxspec", dict, {})
    stream_options = _field(body, "stream_options", dict, {})
    return GenerationRequest(
        kind, prompt, params, max_tokens,
        # Like OpenAI: no seed, a fresh draw. MLX keys take an unsigned 64-bit seed; fold any int in.
        secrets.randbelow(2**31) if seed is None else seed % 2**64,
        _stops(body.get("stop")), _field(body, "stream", bool, False),
        bool(stream_options.get("include_usage", False)), bool(extension.get("token_status", False)))


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
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
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


# --- text, stop strings and counts ------------------------------------------------------------


class StopScanner:
    """Cuts streamed text at the first stop string. Text that could still be the start of one is
    held back until the next piece settles it, so a client never sees part of a stop string."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that is now certain to be output (nothing once a stop string was seen)."""
        if self.stopped:
            return ""
        buf = self.held + text
        hits = [i for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return buf[: min(hits)]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                    if s.startswith(buf[len(buf) - n:])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of the reply: what was held back was not a stop string after all."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


class Tally(RunCollector):
    """Usage and speculation statistics of one reply, from the engine's events as ``RunCollector``
    folds them. A reply cut short (stop string, client gone) has no ``Done``; its steps still
    count what was decoded."""

    def __init__(self, prompt_tokens: int):
        super().__init__()
        self.prompt_tokens = prompt_tokens

    @property
    def stop_reason(self) -> str | None:
        """The engine's: "eos" | "length" | "context"; None before its ``Done``."""
        return self.done.stop_reason if self.done is not None else None

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.tokens),
                "total_tokens": self.prompt_tokens + len(self.tokens)}

    def speculation(self, drafter: str | None, k: int | str) -> dict:
        """``acceptance`` is accepted / drafted (None when nothing was drafted);
        ``tokens_per_step`` the output tokens per target pass."""
        steps, drafted, accepted = len(self.drafted), sum(self.drafted), sum(self.accepted)
        return {"drafter": drafter, "k": k if drafter else 0, "steps": steps, "drafted": drafted,
                "accepted": accepted, "acceptance": round(accepted / drafted, 4) if drafted else None,
                "tokens_per_step": round(len(self.tokens) / steps, 4) if steps else None,
                "draft_ms": round(sum(self.draft_ms), 2), "verify_ms": round(sum(self.verify_ms), 2)}


@dataclass(frozen=True)
class Delta:
    """What one engine step adds to the reply: its text (after stop strings) and its tokens."""

    text: str
    tokens: list[dict] = field(default_factory=list)


class Reply:
    """One reply's events as text: streaming detokenisation (rejected drafts decoded on their
    own, outside the reply), stop strings, and the tally."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...], prompt_tokens: int):
        self.text = StepText(tokenizer)
        self.scanner = StopScanner(stops)
        self.tally = Tally(prompt_tokens)

    @property
    def stopped(self) -> bool:
        return self.scanner.stopped

    def step(self, ev: Step) -> Delta:
        self.tally.add(ev)
        pieces = list(self.text.pieces(ev))
        text = "".join(piece for t, piece in pieces if t.status is not Status.REJECTED)
        tokens = [{"id": t.id, "text": piece, "status": t.status.value} for t, piece in pieces]
        return Delta(self.scanner.feed(text), tokens)

    def finish(self) -> Delta:
        """The text the detokeniser and the stop scanner still hold."""
        return Delta(self.scanner.feed(self.text.finish()) + self.scanner.flush())

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stopped or self.tally.stop_reason == "eos" else "length"


# --- the decoding thread -----------------------------------------------------------------------

_END = object()  # a job's last item


@dataclass
class Job:
    """One request on its way through the decoder: the engine's events come back on ``items``;
    setting ``cancel`` stops decoding after the current step."""

    ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    items: queue.Queue = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def events(self) -> Iterator[Event]:
        """The engine's events until the job ends; an engine failure is raised here."""
        while (item := self.items.get()) is not _END:
            if isinstance(item, MlxspecError):
                raise ApiError(400, str(item), "invalid_request")
            if isinstance(item, BaseException):
                raise ApiError(500, f"decoding failed: {item!r}", "server_error", "server_error")
            yield item


@dataclass(frozen=True)
class ModelInfo:
    """What handler threads may read about the loaded model (fixed once loaded)."""

    name: str
    tokenizer: Any
    context_length: int
    vocab_size: int  # token ids a request may send: 0 .. vocab_size - 1
    drafter: str | None
    k: int | str


class Decoder:
    """The one thread that runs MLX: it loads the target, makes the drafter and the K policy, then
    decodes queued jobs one at a time. The queue is the lock around the engine; keeping every MLX
    call on one long-lived thread also keeps MLX's per-thread state off the short-lived handler
    threads (whose exit-time destructors can abort the process, see ``tui.threads``)."""

    def __init__(self, options: ServeOptions, loaded: Any = None, log: Log | None = None):
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.cancelled = 0  # jobs stopped before the engine finished (client gone, stop string)
        self.info: ModelInfo | None = None
        self._current: Job | None = None
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(options, loaded, log), name="mlxspec-decoder",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def close(self) -> None:
        """Stop after the current step; queued jobs end empty. Waits for the thread to be gone."""
        from mlxspec.tui.threads import wait_for_thread_exit

        self._closing.set()
        if (job := self._current) is not None:
            job.cancel.set()
        self.jobs.put(None)
        self._thread.join()
        wait_for_thread_exit(self._thread.native_id)

    def _run(self, options: ServeOptions, loaded: Any, log: Log | None) -> None:
        try:
            session = Session.open(options.session, loaded, log=log if log is not None else stderr_line)
        except BaseException as e:  # reported by the constructor on the caller's thread
            self._failure = e
            self._ready.set()
            return
        lm, drafter = session.lm, session.drafter
        k = f"tree {options.tree}" if options.tree is not None else "auto" if options.k is None else options.k
        self.info = ModelInfo(lm.name, lm.tokenizer, lm.context_length, lm.config.vocab_size,
                              drafter.name if drafter else None, k)
        self._ready.set()
        while (job := self.jobs.get()) is not None:
            self._current = job
            self._decode(job, session)
            self._current = None
        ops_for(lm.model).synchronize()

    def _decode(self, job: Job, session: Session) -> None:
        if job.cancel.is_set() or self._closing.is_set():  # its client left while it queued, or we stop
            job.items.put(_END)
            return
        # A request that continues the last conversation prefills only what is new (keep=True).
        events = session.stream(job.ids, job.params, job.max_tokens, job.seed, keep=True)
        try:
            for ev in events:
                job.items.put(ev)
                if job.cancel.is_set() and not isinstance(ev, Done):
                    self.cancelled += 1
                    break
        except Exception as e:  # the handler turns it into an error response
            job.items.put(e)
        finally:
            events.close()
            ops_for(session.lm.model).synchronize()  # target-only decoding leaves one step in flight when stopped early
            job.items.put(_END)


# --- responses ----------------------------------------------------------------------------------


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


def choice(kind: str, text: str, finish: str | None, chunk: bool, role: bool = False) -> dict:
    """One choice: a chat message (or a chunk's delta) or a text completion's text."""
    if kind == TEXT:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if not chunk:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}
    delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def full_response(meta: ResponseMeta, text: str, reply: Reply, info: ModelInfo, tokens: list[dict] | None) -> dict:
    out = meta.envelope([choice(meta.kind, text, reply.finish_reason, chunk=False)], chunk=False)
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
    for d in deltas:
        if d.text or (req.token_status and d.tokens):
            out = meta.envelope([choice(meta.kind, d.text, None, chunk=True)], chunk=True)
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


# --- HTTP ----------------------------------------------------------------------------------------


class Server(ThreadingHTTPServer):
    """The HTTP side: handler threads parse and tokenise, the ``Decoder`` decodes."""

    daemon_threads = True

    def __init__(self, options: ServeOptions, log: Log | None = None):
        self.options, self.log = options, log
        self.started = int(time.time())
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer may refuse concurrent encodes
        try:
            super().__init__((options.host, options.port), Handler)
        except OSError as e:
            raise MlxspecError(f"cannot listen on {options.host}:{options.port}: {e.strerror}") from None

    def attach(self, decoder: Decoder) -> None:
        """The decoder this server hands requests to, once its model is loaded."""
        assert decoder.info is not None
        self.decoder, self.info = decoder, decoder.info
        self.names = frozenset({self.info.name, "default", self.options.model})

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def encode(self, req: GenerationRequest) -> list[int]:
        """Prompt token ids: the chat template for chat, the raw text for completions."""
        from mlxspec.targets.tokenizer import encode_prompt

        if req.kind == TEXT and isinstance(req.prompt, list):
            ids = list(req.prompt)
            # An id past the embedding table reads outside it: garbage, or a crash of the process.
            bad = next((t for t in ids if not 0 <= t < self.info.vocab_size), None)
            if bad is not None:
                raise ApiError(400, f"token id {bad} is outside the vocabulary (0..{self.info.vocab_size - 1})",
                               "invalid_prompt")
        else:
            try:
                with self.tokenizer_lock:
                    ids = encode_prompt(self.info.tokenizer, req.prompt, raw=req.kind == TEXT)
            except Exception as e:  # e.g. a template that refuses the message order
                raise ApiError(400, f"cannot encode the prompt: {e}", "invalid_prompt") from None
        if not ids:
            raise ApiError(400, "the prompt is empty", "missing_prompt")
        if len(ids) >= self.info.context_length:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; the model's context is "
                           f"{self.info.context_length}", "context_length_exceeded")
        return ids

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self) -> dict:
        return {"id": self.info.name, "object": "model", "created": self.started, "owned_by": "mlxspec",
                "mlxspec": {"drafter": self.info.drafter, "k": self.info.k if self.info.drafter else 0,
                            "context_length": self.info.context_length}}

    def close(self) -> None:
        self.server_close()
        self.decoder.close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streamed replies close their connection instead
    server: Server

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _guarded(self, route: Callable[[str], None]) -> None:
        try:
            route(self.path.split("?", 1)[0].rstrip("/"))
        except ApiError as e:
            self._json(e.status, e.body())
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    def _get(self, path: str) -> None:
        if path == "/v1/models":
            return self._json(200, self.server.models())
        if path.startswith("/v1/models/"):
            check_model({"model": path.removeprefix("/v1/models/")}, frozenset({self.server.info.name}))
            return self._json(200, self.server.model_card())
        self._no_route("GET", path)

    def _post(self, path: str) -> None:
        kinds = {"/v1/chat/completions": CHAT, "/v1/completions": TEXT}
        if path not in kinds:
            self._read_body()  # keep the connection usable for the next request
            return self._no_route("POST", path)
        req = parse_generation(kinds[path], parse_json(self._read_body()), self.server.options, self.server.names)
        ids = self.server.encode(req)
        job = Job(ids, req.params, req.max_tokens, req.seed)
        self.server.decoder.submit(job)
        reply = Reply(self.server.info.tokenizer, req.stop, len(ids))
        meta = ResponseMeta.new(req.kind, self.server.info.name)
        try:
            (self._stream if req.stream else self._whole)(req, job, reply, meta)
        finally:
            job.cancel.set()  # a no-op when the engine already finished

    def _whole(self, req: GenerationRequest, job: Job, reply: Reply, meta: ResponseMeta) -> None:
        deltas = list(_deltas(job, reply))
        tokens = [t for d in deltas for t in d.tokens] if req.token_status else None
        self._json(200, full_response(meta, "".join(d.text for d in deltas), reply, self.server.info, tokens))

    def _stream(self, req: GenerationRequest, job: Job, reply: Reply, meta: ResponseMeta) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the body ends when the connection does
        self.end_headers()
        self.close_connection = True
        try:
            for obj in stream_chunks(meta, req, _deltas(job, reply), reply, self.server.info):
                self._event(json.dumps(obj))
        except ApiError as e:  # the status line is gone; the error becomes the last event
            self._event(json.dumps(e.body()))
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self._log("client went away mid-stream; decoding stopped")
            return
        self._event("[DONE]")

    def _event(self, data: str) -> None:
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "bad Content-Length", "invalid_request")
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body would be taken for the next request
            raise ApiError(413, f"the request body is {length} bytes; the limit is {MAX_BODY_BYTES}",
                           "request_too_large")
        return self.rfile.read(length)

    def _no_route(self, method: str, path: str) -> None:
        raise ApiError(404, f"no route {method} {path or '/'}; try GET /v1/models, POST /v1/chat/completions "
                       "or POST /v1/completions", "not_found")

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _log(self, line: str) -> None:
        if self.server.log is not None:
            self.server.log(line)

    def log_message(self, format: str, *args: Any) -> None:  # the base class names it format
        self._log(f"{self.address_string()} {format % args}")


def _deltas(job: Job, reply: Reply) -> Iterator[Delta]:
    """The reply's deltas as the engine decodes, ending early at a stop string; leaving early
    (a stop string, or the caller closing this) cancels the job."""
    try:
        for ev in job.events():
            if isinstance(ev, Step):
                yield reply.step(ev)
                if reply.stopped:
                    break
            else:
                reply.tally.add(ev)
        yield reply.finish()
    finally:
        job.cancel.set()


def start_server(options: ServeOptions, loaded: Any = None, log: Log | None = None) -> Server:
    """Bind the socket (first, so a taken port fails before a model loads), then load the model
    (or take ``loaded``) on the decoder thread; the caller runs ``serve_forever``, then ``close``."""
    server = Server(options, log)
    try:
        server.attach(Decoder(options, loaded, log))
    except BaseException:
        server.server_close()
        raise
    return server


def run_server(options: ServeOptions, log: Log) -> None:
    """``mlxspec serve``: serve until Ctrl-C, then stop decoding and close cleanly."""
    server = start_server(options, log=log)
    info = server.info
    spec = f"draft {info.drafter}, k {info.k}" if info.drafter else "target-only"
    log(f"mlxspec serve: {info.name} ({spec}) on {server.url} (Ctrl-C stops)")
    restore = _stop_on_sigterm()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log("mlxspec serve: stopping")
    finally:
        server.close()
        restore()


def _stop_on_sigterm() -> Callable[[], None]:
    """Let a service manager's SIGTERM stop the server as cleanly as Ctrl-C; returns the undo."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)
