"""The server's life around its requests, on a tiny random model with the real tokenizer: the
prompt cache across clients taking turns (``--prompt-cache-size``), ``GET /health`` reporting it,
and a shutdown that cuts replies short saying so (an error, never a normal finish)."""

from __future__ import annotations

import http.client
import json
import threading
import time

import mlx.core as mx
import pytest

from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.serve import ServeOptions, start_server
from mlxspec.targets.loading import LoadedModel

pytestmark = pytest.mark.model  # the real tokenizer (the model's weights are not used)


class SlowModel:
    """The tiny target, ``delay_s`` slower per pass, so a shutdown lands mid-reply."""

    def __init__(self, model: Llama, delay_s: float):
        self.model, self.delay_s = model, delay_s
        self.cfg, self.capabilities = model.cfg, model.capabilities

    def make_cache(self):
        return self.model.make_cache()

    def __call__(self, *args, **kw):
        time.sleep(self.delay_s)
        return self.model(*args, **kw)


def tiny(lm, delay_s: float = 0.0) -> LoadedModel:
    mx.random.seed(0)
    cfg = LlamaConfig(vocab_size=lm.config.vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, rope_theta=10000.0)
    model = Llama(cfg)
    mx.eval(model.parameters())
    return LoadedModel(SlowModel(model, delay_s) if delay_s else model, lm.tokenizer, "tiny-random", lm.path,
                       "float32", context_length=512)


def serving(loaded: LoadedModel, **options):
    server = start_server(ServeOptions(port=0, **options), loaded=loaded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


def call(server, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def completion(server, ids: list[int], n: int = 4, **extra) -> list[int]:
    status, body = call(server, "POST", "/v1/completions",
                        {"prompt": ids, "max_tokens": n, "temperature": 0, **extra, "mlxspec": {"token_status": True}})
    assert status == 200, body
    return [t["id"] for t in body["mlxspec"]["tokens"] if t["status"] != "rejected"]


def test_clients_taking_turns_each_hit_their_cache_and_health_says_so(lm):
    server = serving(tiny(lm), draft="ngram:3", k=2, prompt_cache_size=3)
    try:
        a, b = [5, 6, 7, 8, 9], [40, 41, 42, 43]
        for _ in range(3):
            for client in ("a", "b"):
                ids = a if client == "a" else b
                got = completion(server, ids)
                ids += got + [11]
        status, health = call(server, "GET", "/health")
        assert status == 200 and health["prompt_cache"]["entries"] == 2
        assert (health["decoding"], health["parallel"]) == (0, 1)  # MLX: one request at a time
        assert (health["prompt_cache"]["hits"], health["prompt_cache"]["misses"]) == (4, 2)
        assert 0 < health["prompt_cache"]["bytes"] <= ServeOptions().prompt_cache_bytes
    finally:
        server.shutdown()
        server.close()


def test_replies_are_the_same_with_and_without_cache_hits(lm):
    cached, fresh = serving(tiny(lm), draft="ngram:3", k=2, prompt_cache_size=3), serving(tiny(lm), draft="ngram:3", k=2)
    try:
        convos = {0: [3, 4, 5, 6], 1: [3, 4, 5, 9]}  # a shared prefix: one client's cache serves the other's start
        for client in (0, 1, 0, 1, 0):
            for extra in ({}, {"temperature": 1.0, "seed": 7}):
                got = completion(cached, convos[client], 5, **extra)
                # the fresh server is emptied first: its every request starts afresh
                fresh.decoder.prompt_cache.clear()
                assert got == completion(fresh, convos[client], 5, **extra)
            convos[client] += got + [client + 20]
        assert cached.decoder.prompt_cache.hits >= 4
    finally:
        for s in (cached, fresh):
            s.shutdown()
            s.close()


def stream_lines(server, body: dict) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn.getresponse(), conn


def test_a_shutdown_ends_a_stream_with_an_error_not_a_finish(lm):
    server = serving(tiny(lm, delay_s=0.02))
    resp, conn = stream_lines(server, {"prompt": [1, 2, 3], "max_tokens": 400, "temperature": 0, "stream": True})
    first = resp.readline()
    assert first.startswith(b"data: {")
    server.shutdown()
    server.close()  # while the reply is decoding, as Ctrl-C does
    events = [first.decode()[6:].strip()] + [ln[6:].strip() for ln in resp.read().decode().splitlines()
                                             if ln.startswith("data: ")]
    conn.close()
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert chunks[-1]["error"]["code"] == "server_shutdown" and chunks[-1]["error"]["type"] == "server_error"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1] if c.get("choices"))
    assert len(chunks) - 1 < 400  # it was cut, not finished


def test_a_shutdown_answers_a_whole_request_with_503(lm):
    server = serving(tiny(lm, delay_s=0.02))
    out = {}

    def ask():
        out["reply"] = call(server, "POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 400})

    asking = threading.Thread(target=ask)
    asking.start()
    while server.replying == 0:
        time.sleep(0.01)
    time.sleep(0.1)
    server.shutdown()
    server.close()
    asking.join(10)
    status, body = out["reply"]
    assert status == 503 and body["error"]["code"] == "server_shutdown"
