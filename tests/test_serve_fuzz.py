"""Nothing a client sends takes the server down: seeded random requests (``fuzzhttp``) against a
live server on a tiny random model with the real tokenizer, loopback only, bounded in count.
Every request gets a JSON error or a valid reply, nothing hangs, nothing logs a traceback, and a
normal request is still answered at the end. Several clients fuzz at once, beside one that keeps
sending prompts of several chunks, between whose chunks the server decodes the others' requests.
Both ways of serving: one request at a time (MLX), and several decoding together (torch,
``--parallel 4``). ``MLXSPEC_FUZZ_REQUESTS=10000`` runs the long soak (``MLXSPEC_FUZZ_CLIENTS``:
how many at once)."""

from __future__ import annotations

import json
import os
import random
import threading

import mlx.core as mx
import openai
import pytest
from fuzzhttp import exchange, request

from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.serve import ServeOptions, start_server
from mlxspec.serve.server import Handler
from mlxspec.targets.loading import LoadedModel

REQUESTS = int(os.environ.get("MLXSPEC_FUZZ_REQUESTS", "300"))
CLIENTS = int(os.environ.get("MLXSPEC_FUZZ_CLIENTS", "4"))
STALL_S = 0.5  # the server's read timeout here: a request promising more body than it sends waits this long


@pytest.fixture(scope="module", params=["one at a time", "together"])
def tiny_server(lm, request):
    """The server on MLX, decoding one request at a time; or on the torch twin, four together."""
    mx.random.seed(0)
    cfg = LlamaConfig(vocab_size=lm.config.vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, rope_theta=10000.0)
    model = Llama(cfg)
    mx.eval(model.parameters())
    tiny = LoadedModel(model, lm.tokenizer, "tiny-random", lm.path, "float32", context_length=2048)
    parallel = 1 if request.param == "one at a time" else 4
    if parallel > 1:
        pytest.importorskip("greenlet", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")
        from mlxspec.torchpath import invariant
        from mlxspec.torchpath.model import Llama as TorchLlama

        twin = TorchLlama.from_mlx(model)
        invariant.make_batch_invariant(twin)
        tiny = LoadedModel(twin, lm.tokenizer, "tiny-random", lm.path, "float32", 2048, "torch:cpu", tiny)
    logs: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Handler, "timeout", STALL_S)
        server = start_server(ServeOptions(draft="ngram:3", k=2, port=0, max_tokens=3, parallel=parallel), loaded=tiny,
                              log=logs.append)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server, thread, logs
        server.shutdown()
        server.close()


def check_answer(data: bytes, status: int | None, headers: dict[str, str], body: bytes) -> str | None:
    """What is wrong with the server's answer to ``data``, or None."""
    if status is None:
        # a blank request line asks nothing (blank as the server reads it: Latin-1, str.split)
        return None if not data.split(b"\n", 1)[0].decode("latin-1").split() else "no HTTP answer"
    if data.split(b" ", 1)[0] == b"HEAD":
        return None
    if headers.get("content-type") == "text/event-stream":
        events = [ln[6:] for ln in body.decode().splitlines() if ln.startswith("data: ")]
        if not events or events[-1] != "[DONE]" and "error" not in json.loads(events[-1]):
            return "a stream that neither finished nor ended in an error"
        for e in events[:-1]:
            json.loads(e)
        return None
    if headers.get("content-type") != "application/json":
        return f"content type {headers.get('content-type')!r}"
    obj = json.loads(body)
    if status >= 400:
        return None if obj["error"]["message"] and obj["error"]["type"] else "an error without its message"
    return None if status == 200 and ("choices" in obj or obj.get("object") in ("list", "model")) else f"{status}"


def fuzz(address: tuple[str, int], seed: int, count: int, statuses: dict, problems: list[str]) -> None:
    """One client's share of the fuzzed requests; the first wrong answer ends it."""
    host, rng = f"{address[0]}:{address[1]}", random.Random(seed)
    for i in range(count):
        data = request(rng, host)
        try:
            status, headers, body = exchange(address, data, timeout=30)
        except TimeoutError:
            problems.append(f"client {seed}, request {i}: no answer in 30 s\n{data[:300]!r}")
            return
        problem = check_answer(data, status, headers, body)
        if problem is not None:
            problems.append(f"client {seed}, request {i}: {problem}\n{data[:300]!r}\n-> {status} {body[:300]!r}")
            return
        statuses[status] = statuses.get(status, 0) + 1  # one dict per client: no lock needed


def long_prompts(address: tuple[str, int], done: threading.Event, answered: list[int]) -> None:
    """Prompts of three chunks, one after the other until the fuzzing clients are done."""
    body = json.dumps({"prompt": "the cat sat on the mat and " * 160, "max_tokens": 2}).encode()
    data = (f"POST /v1/completions HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    while not done.is_set():
        answered.append(exchange(address, data, timeout=60)[0])


@pytest.mark.model
def test_the_server_answers_every_fuzzed_request(tiny_server, capfd):
    server, thread, logs = tiny_server
    address = server.server_address[:2]
    per_client = [{} for _ in range(CLIENTS)]
    problems: list[str] = []
    done, answered = threading.Event(), []
    longs = threading.Thread(target=long_prompts, args=(address, done, answered))
    longs.start()
    clients = [threading.Thread(target=fuzz, args=(address, 20261201 + c, REQUESTS // CLIENTS, per_client[c], problems))
               for c in range(CLIENTS)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    done.set()
    longs.join()
    assert not problems, problems[0]
    assert answered and set(answered) == {200}  # the long prompts were answered beside the fuzzing
    if server.decoder.slots is None:  # one at a time: requests were decoded inside the long prompts' prefill
        assert server.decoder.served_between_chunks > 0
    else:  # together: requests' steps went in one pass
        assert max(server.decoder.slots.stats.packed_rows) > 3
    statuses: dict[int | None, int] = {}
    for d in per_client:
        for k, v in d.items():
            statuses[k] = statuses.get(k, 0) + v
    assert thread.is_alive()
    c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    reply = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens <= 2
    assert not any("Traceback" in line for line in logs)
    assert "Traceback" not in capfd.readouterr().err
    n = REQUESTS // CLIENTS * CLIENTS
    assert statuses.get(200, 0) > n // 20 and sum(v for s, v in statuses.items() if s and s >= 400) > n // 4
