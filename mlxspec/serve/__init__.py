"""``mlxspec serve``: an OpenAI-compatible HTTP server over the same engine as ``generate``.

I/O lives at the edge. Parsing a request, scanning for stop strings, counting usage and shaping
responses are pure (tested without a model); one ``Decoder`` thread runs every model call and
takes requests from a queue, one at a time or several together (``batch``: each in a greenlet on
that thread, their passes packed), and ``http.server`` handler threads only read requests,
tokenise, detokenise and write.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (both also
with ``stream: true`` as server-sent events). Next to ``usage`` every response carries
``speculation``, counted from the engine's events; a request with ``"mlxspec": {"token_status":
true}`` also gets each token with its status (accepted, rejected, corrected, bonus, plain).

One module per concern: ``requests`` (options, parsing and checking a request), ``reply`` (text,
stop strings and counts of one reply), ``decoder`` (the decoding thread), ``responses`` (the JSON
shapes), ``logprobs`` (reported log-probabilities in OpenAI's shapes) and ``server`` (HTTP,
starting and stopping).
"""

from __future__ import annotations

import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)
from mlxspec.serve.decoder import Decoder, Job, Log, ModelInfo
from mlxspec.serve.reply import Delta, Reply, StopScanner, Tally
from mlxspec.serve.requests import (
    CHAT,
    MAX_STOPS,
    TEXT,
    ApiError,
    GenerationRequest,
    ServeOptions,
    check_model,
    parse_generation,
    parse_json,
)
from mlxspec.serve.responses import ResponseMeta, choice, full_response, stream_chunks
from mlxspec.serve.server import MAX_BODY_BYTES, Handler, Server, run_server, start_server

__all__ = [
    "CHAT", "MAX_BODY_BYTES", "MAX_STOPS", "TEXT", "ApiError", "Decoder", "Delta", "GenerationRequest", "Handler",
    "Job", "Log", "ModelInfo", "Reply", "ResponseMeta", "ServeOptions", "Server", "StopScanner", "Tally", "check_model",
    "choice", "full_response", "parse_generation", "parse_json", "run_server", "start_server", "stream_chunks",
]
