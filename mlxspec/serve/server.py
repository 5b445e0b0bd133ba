"""The HTTP side of ``mlxspec serve``: handler threads read a request, tokenise it, hand it to
the ``Decoder`` and write the reply as it decodes; ``run_server`` serves until Ctrl-C."""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mlxspec.core.events import Step
from mlxspec.errors import MlxspecError
from mlxspec.targets.tokenizer import encode_prompt
from mlxspec.serve.decoder import Decoder, Job, Log
from mlxspec.serve.reply import Delta, Reply
from mlxspec.serve.requests import (
    CHAT,
    TEXT,
    ApiError,
    GenerationRequest,
    ServeOptions,
    check_bias_ids,
    check_model,
    parse_generation,
    parse_json,
)
from mlxspec.serve.responses import ResponseMeta, full_response, stream_chunks

MAX_BODY_BYTES = 8 << 20  # far above any prompt that fits the context; refuses runaway uploads
DRAIN_BYTES = 64 << 20  # of a refused body, read and dropped after the refusal (so no reset loses it)
LINGER_S = 2.0  # how long that dropping may wait for a client that stopped sending
CLOSE_WAIT_S = 2.0  # at shutdown, how long replies cut short may take to say so
READ_TIMEOUT_S = 30.0  # a client that stops sending its request (line, headers or body) is let go
ROUTES = {"/v1/models": "GET", "/v1/chat/completions": "POST", "/v1/completions": "POST",
          "/health": "GET"}


class Server(ThreadingHTTPServer):
    """The HTTP side: handler threads parse and tokenise, the ``Decoder`` decodes."""

    daemon_threads = True

    def __init__(self, options: ServeOptions, log: Log | None = None):
        self.options, self.log = options, log
        self.started = int(time.time())
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer may refuse concurrent encodes
        self.replying = 0  # generation requests between their submit and their reply's last byte
        self.replied = threading.Condition()
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

        if req.kind == TEXT and isinstance(req.prompt, list):
            ids = list(req.prompt)
            # An id past the embedding table reads outside it: garbage, or a crash of the process.
            bad = next((t for t in ids if not 0 <= t < self.info.vocab_size), None)
            if bad is not None:
                raise ApiError(400, f"token id {bad} is outside the vocabulary (0..{self.info.vocab_size - 1})",
                               "invalid_prompt")
        else:
            _check_utf8(req.prompt)
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
        """Stop taking connections, stop decoding, then give the handler threads (daemons, gone
        when the process exits) ``CLOSE_WAIT_S`` to tell their clients that their replies
        were cut short (``decoder.shutting_down``)."""
        self.server_close()
        self.decoder.close()
        with self.replied:
            self.replied.wait_for(lambda: self.replying == 0, timeout=CLOSE_WAIT_S)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streamed replies close their connection instead
    timeout = READ_TIMEOUT_S  # on the socket: a request that stalls ends its connection
    server: Server

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def do_HEAD(self) -> None:
        self._guarded(self._not_allowed)

    def do_OPTIONS(self) -> None:
        self._guarded(self._options)

    do_PUT = do_DELETE = do_PATCH = do_HEAD

    def _guarded(self, route: Callable[[str], None]) -> None:
        try:
            try:
                path = self.path.split("?", 1)[0].rstrip("/")
                if not self.server.options.access.allows(self.command, path, self.headers.get("Authorization")):
                    self._refuse_unauthorized()
                route(path)
            except ApiError as e:
                self._json(e.status, e.body(), e.headers)
                self._linger()
            except TimeoutError:
                self._json(408, ApiError(408, f"the request was not received within {self.timeout:g} s",
                                         "request_timeout").body())
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            self.close_connection = True  # the client is gone: nobody to tell

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What the base class answers itself (a garbage request line, headers too long, an
        unknown method) in the API's JSON error shape instead of an HTML page. A request line
        without a version is garbage, not HTTP/0.9: it too gets a status line and headers."""
        self.close_connection, self.request_version = True, self.protocol_version
        try:
            self._json(code, ApiError(code, message or self.responses.get(code, ("error",))[0], "invalid_request").body())
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            pass

    def end_headers(self) -> None:
        """Every answer carries the CORS headers its request's origin is allowed (none for
        others, nor for a request the base class could not parse)."""
        headers = getattr(self, "headers", None)
        if headers is not None:
            cors = self.server.options.access.cors_headers(headers.get("Origin"), self.command == "OPTIONS",
                                                           headers.get("Access-Control-Request-Headers"))
            for name, value in cors.items():
                self.send_header(name, value)
        super().end_headers()

    def _refuse_unauthorized(self) -> None:
        try:  # its body is dropped after the refusal (``_linger``), not taken for the next request
            self.unread = max(0, int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.unread = 0
        self.close_connection = True
        raise ApiError(401, "missing or wrong API key: send the header Authorization: Bearer KEY", "invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})

    def _options(self, path: str) -> None:
        """A browser's CORS preflight: 204, with the CORS headers where ``--allowed-origins``
        names its origin. Without any allowed origin, OPTIONS is not a method here."""
        if not self.server.options.access.origins:
            return self._not_allowed(path)
        if path not in ROUTES and not path.startswith("/v1/models/"):
            self._no_route(self.command, path)
        self._read_body()
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _not_allowed(self, path: str) -> None:
        if self.command != "HEAD":
            self._read_body()
        if path.startswith("/v1/models/"):
            path = "/v1/models"
        if path not in ROUTES:
            self._no_route(self.command, path)
        raise ApiError(405, f"{self.command} {path} is not allowed; use {ROUTES[path]}", "method_not_allowed",
                       headers={"Allow": ROUTES[path]})

    def _get(self, path: str) -> None:
        if path == "/health":  # for a load balancer or a supervisor: the model is loaded and requests are taken
            cached = self.server.decoder.prompt_cache.stats()
            return self._json(200, {"status": "ok", "model": self.server.info.name,
                                    "queued": self.server.decoder.jobs.qsize(),
                                    "decoding": self.server.decoder.decoding, "parallel": self.server.decoder.parallel,
                                    "prompt_cache": {"entries": cached.entries, "bytes": cached.nbytes,
                                                     "hits": cached.hits, "misses": cached.misses}})
        if path == "/v1/models":
            return self._json(200, self.server.models())
        if path.startswith("/v1/models/"):
            check_model({"model": path.removeprefix("/v1/models/")}, self.server.names)  # "default" too
            return self._json(200, self.server.model_card())
        self._not_allowed(path)

    def _post(self, path: str) -> None:
        kinds = {"/v1/chat/completions": CHAT, "/v1/completions": TEXT}
        if path not in kinds:
            return self._not_allowed(path)  # reads the body first: the connection stays usable
        req = parse_generation(kinds[path], parse_json(self._read_body()), self.server.options, self.server.names)
        ids = self.server.encode(req)
        check_bias_ids(req, self.server.info.vocab_size)
        job = Job(ids, req.params, req.max_tokens, req.seed, req.logprobs)
        with self.server.replied:
            self.server.replying += 1
        try:
            start = time.perf_counter()
            self.server.decoder.submit(job)
            reply = Reply(self.server.info.tokenizer, req.stop, len(ids))
            meta = ResponseMeta.new(req.kind, self.server.info.name)
            (self._stream if req.stream else self._whole)(req, job, reply, meta)
            self._log(_request_line(path, reply, time.perf_counter() - start, self.server.info))
        finally:
            job.cancel.set()  # a no-op when the engine already finished
            with self.server.replied:
                self.server.replying -= 1
                self.server.replied.notify_all()

    def _whole(self, req: GenerationRequest, job: Job, reply: Reply, meta: ResponseMeta) -> None:
        deltas = list(_deltas(job, reply, alive=self._client_here))
        if not self._client_here():  # _deltas has cancelled the job either way
            self._log("client went away before its reply; decoding stopped")
            self.close_connection = True
            return
        tokens = [t for d in deltas for t in d.tokens] if req.token_status else None
        logprobs = [e for d in deltas for e in d.logprobs] if req.logprobs is not None else None
        self._json(200, full_response(meta, "".join(d.text for d in deltas), reply, self.server.info, tokens,
                                      logprobs))

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

    def _client_here(self) -> bool:
        """False once the client has closed its end (a readable socket with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or self.connection.recv(1, socket.MSG_PEEK) != b""
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "bad Content-Length", "invalid_request")
        if length > MAX_BODY_BYTES:
            self.close_connection, self.unread = True, length  # the unread body would be taken for the next request
            raise ApiError(413, f"the request body is {length} bytes; the limit is {MAX_BODY_BYTES}",
                           "request_too_large")
        body = self.rfile.read(length)
        if len(body) < length:  # the client closed early
            self.close_connection = True
            raise ApiError(400, f"the body ended after {len(body)} of {length} bytes", "invalid_request")
        return body

    def _read_chunked(self) -> bytes:
        """A ``Transfer-Encoding: chunked`` body, at most ``MAX_BODY_BYTES``."""
        body = bytearray()
        while True:
            try:
                size = int(self.rfile.readline(64).split(b";")[0].strip() or b"x", 16)
            except ValueError:
                self.close_connection = True
                raise ApiError(400, "bad chunk size in a chunked body", "invalid_request") from None
            if size < 0 or len(body) + size > MAX_BODY_BYTES:
                self.close_connection = True
                raise ApiError(413, f"the request body is over the limit of {MAX_BODY_BYTES} bytes",
                               "request_too_large")
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailer fields, up to the blank line
                    pass
                return bytes(body)
            body += self.rfile.read(size)
            self.rfile.readline(3)  # the chunk's CRLF

    unread = 0  # bytes of a refused body still on their way

    def _linger(self) -> None:
        """After refusing a body: read and forget what the client still sends of it (up to
        ``DRAIN_BYTES``, ``LINGER_S`` without data at most), so that closing the connection
        with data unread does not reset it before the client has read the refusal."""
        left, self.unread = min(self.unread, DRAIN_BYTES), 0
        self.connection.settimeout(LINGER_S)
        while left > 0 and (got := self.rfile.read1(min(left, 1 << 20))):
            left -= len(got)

    def _no_route(self, method: str, path: str) -> None:
        raise ApiError(404, f"no route {method} {path or '/'}; try GET /v1/models, POST /v1/chat/completions "
                       "or POST /v1/completions", "not_found")

    def _json(self, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _log(self, line: str) -> None:
        if self.server.log is not None:
            self.server.log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}")

    def log_message(self, format: str, *args: Any) -> None:  # the base class names it format
        self._log(f"{self.address_string()} {format % args}")


def _request_line(path: str, reply: Reply, seconds: float, info: Any) -> str:
    """The log's line for one answered request: its tokens, time, finish and acceptance."""
    usage, spec = reply.tally.usage(), reply.tally.speculation(info.drafter, info.k)
    line = (f"{path}: {usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens in "
            f"{seconds:.2f} s ({reply.finish_reason})")
    if spec["acceptance"] is not None:
        line += f"; {info.drafter}: {spec['accepted']}/{spec['drafted']} drafts accepted over {spec['steps']} steps"
    return line


def _check_utf8(prompt: Any) -> None:
    """Refuse text that cannot be UTF-8 (JSON allows a lone UTF-16 surrogate, ``"\\ud800"``)."""
    texts = [prompt] if isinstance(prompt, str) else [m.get("content") or "" for m in prompt if isinstance(m, dict)]
    for text in texts:
        try:
            str(text).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApiError(400, f"the prompt holds a lone UTF-16 surrogate ({text[e.start]!r} at character {e.start}); "
                           "send valid Unicode", "invalid_prompt") from None


def _deltas(job: Job, reply: Reply, alive: Callable[[], bool] | None = None) -> Iterator[Delta]:
    """The reply's deltas as the engine decodes, ending early at a stop string; leaving early
    (a stop string, the client gone, or the caller closing this) cancels the job."""
    try:
        for ev in job.events(alive):
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
    n = server.decoder.parallel
    decoding = f"up to {n} requests decoding together" if n > 1 else "one request at a time"
    log(f"mlxspec serve: {info.name} ({spec}) on {server.url} (requests' default sampling "
        f"{options.sampling.label}; {decoding}; Ctrl-C stops)")
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
