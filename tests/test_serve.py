"""``mlxspec serve`` against the official ``openai`` client on loopback.

Model tests compare the server's greedy text, usage and speculation counts with the engine run
directly on the same prompt (what ``mlxspec generate --temp 0`` prints), once with an in-process
server (ngram:3, K=4) and once with the real CLI in a subprocess (--draft none)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import pytest

from mlxspec.core.events import Done, Status, Step, Token
from mlxspec.core.sampling import SamplingParams
from mlxspec.serve.logprobs import token_logprobs
from mlxspec.serve.requests import check_bias_ids
from mlxspec.serve import (
    CHAT,
    TEXT,
    ApiError,
    ServeOptions,
    StopScanner,
    choice,
    Tally,
    parse_generation,
    parse_json,
)

try:
    import openai
except ImportError:  # the dev extra installs it; the unit tests below run without it
    openai = None
client_tests = pytest.mark.skipif(openai is None, reason="needs the openai client (pip install -e .[dev])")

CHAT_PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox"
TEXT_PROMPT = "Counting: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
N = 16
NAMES = frozenset({"smollm2-135m-instruct", "default"})


# --- request parsing and counting, no model ---------------------------------------------------


def test_parse_defaults_come_from_the_server_options():
    opts = ServeOptions(sampling=SamplingParams(0.5, 0.9), max_tokens=7)
    req = parse_generation(CHAT, {"messages": [{"role": "user", "content": "hi"}], "seed": 3}, opts, NAMES)
    assert (req.params, req.max_tokens, req.seed, req.stream, req.stop) == (SamplingParams(0.5, 0.9), 7, 3, False, ())
    assert parse_generation(CHAT, {"messages": [{"role": "user", "content": "hi"}], "seed": -1}, opts, NAMES).seed \
        == 2**64 - 1
    req = parse_generation(TEXT, {"prompt": ["hi"], "max_tokens": 2, "temperature": 0, "stop": "\n",
                                  "stream": True, "mlxspec": {"token_status": True}}, opts, NAMES)
    assert (req.prompt, req.max_tokens, req.params.greedy, req.stop, req.stream, req.token_status) == \
        ("hi", 2, True, ("\n",), True, True)


def test_chat_content_parts_are_joined():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert parse_generation(CHAT, body, ServeOptions(), NAMES).prompt == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize("kind, body, status, code", [
    (CHAT, {}, 400, "missing_messages"),
    (CHAT, {"messages": []}, 400, "missing_messages"),
    (CHAT, {"messages": ["hi"]}, 400, "invalid_messages"),
    (CHAT, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "temperature": float("inf")}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "9"}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "unsupported_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5}, 400, "invalid_stop"),
    (TEXT, {"prompt": ""}, 400, "missing_prompt"),
    # not implemented: refused unless their value changes nothing
    (TEXT, {"prompt": "hi", "echo": True}, 400, "unsupported_parameter"),
    # the logits processors and logprobs: OpenAI's (and mlx-lm's) ranges and types
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 2.5}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": -3}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": "1"}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": -1}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1e999}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "repetition_context_size": 0}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "frequency_context_size": 1.5}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101}}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"five": 1}}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"-5": 1}}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"9" * 5000: 1}}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": "1"}}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 1, "05": 2}}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": [5]}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": 2}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, 400,
     "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": True}, 400,
     "invalid_type"),
    (TEXT, {"prompt": "hi", "logprobs": 21}, 400, "invalid_value"),
    (TEXT, {"prompt": "hi", "logprobs": -1}, 400, "invalid_value"),
    (TEXT, {"prompt": "hi", "logprobs": 2, "top_logprobs": 2}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "wat": 1}, 400, "unknown_parameter"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "prompt": "x"}, 400, "unknown_parameter"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "mlxspec": {"token_status": "yes"}}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "mlxspec": {"token_stats": True}}, 400,
     "unknown_parameter"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_k": -1}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "min_p": 2}, 400, "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "coupled": 1}, 400, "invalid_type"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_messages"),
    (CHAT, {"messages": [{"role": "user", "content": None}]}, 400, "invalid_messages"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "invalid_messages"),
    (TEXT, {"prompt": ["a", "b"]}, 400, "missing_prompt"),
])
def test_bad_requests_are_openai_shaped_errors(kind, body, status, code):
    with pytest.raises(ApiError) as e:
        parse_generation(kind, body, ServeOptions(), NAMES)
    assert (e.value.status, e.value.code) == (status, code)
    err = e.value.body()["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error" and err["message"]


def test_neutral_values_of_unimplemented_fields_pass_and_top_k_min_p_are_used():
    body = {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0, "frequency_penalty": 0.0,
            "logprobs": False, "logit_bias": {}, "n": 1, "user": "me", "stream_options": None, "top_k": 5,
            "min_p": 0.1, "temperature": 0.7, "echo": False, "repetition_penalty": 0}
    req = parse_generation(CHAT, body, ServeOptions(), NAMES)
    assert (req.params.top_k, req.params.min_p, req.params.temperature) == (5, 0.1, 0.7)
    assert not req.params.processes and req.logprobs is None  # 0: mlx-lm's server's "no repetition penalty"
    coupled = parse_generation(CHAT, body | {"coupled": True, "seed": 3}, ServeOptions(), NAMES)
    assert coupled.params.is_coupled and coupled.seed == 3 and not req.params.coupled
    block = parse_generation(CHAT, body | {"block_verify": True}, ServeOptions(), NAMES)
    assert block.params.block_verify and not req.params.block_verify


def test_sampling_controls_are_read():
    body = {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5, "frequency_penalty": -1,
            "repetition_penalty": 1.2, "repetition_context_size": 8, "presence_context_size": 4,
            "logit_bias": {"17": -100, "5": 2.5}, "logprobs": True, "top_logprobs": 3}
    req = parse_generation(CHAT, body, ServeOptions(sampling=SamplingParams(top_k=7, min_p=0.05)), NAMES)
    p = req.params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.repetition_context_size,
            p.presence_context_size, p.frequency_context_size) == (0.5, -1.0, 1.2, 8, 4, 20)
    assert p.logit_bias == ((17, -100.0), (5, 2.5)) and (p.top_k, p.min_p) == (7, 0.05)  # the server's defaults
    assert req.logprobs == 3
    assert parse_generation(CHAT, {"messages": body["messages"], "logprobs": True}, ServeOptions(), NAMES).logprobs == 0
    # completions: OpenAI's count, or mlx-lm's boolean with top_logprobs
    assert parse_generation(TEXT, {"prompt": "hi", "logprobs": 2}, ServeOptions(), NAMES).logprobs == 2
    assert parse_generation(TEXT, {"prompt": "hi", "logprobs": 0}, ServeOptions(), NAMES).logprobs == 0
    assert parse_generation(TEXT, {"prompt": "hi", "logprobs": True, "top_logprobs": 4}, ServeOptions(),
                            NAMES).logprobs == 4
    assert parse_generation(TEXT, {"prompt": "hi", "logprobs": None}, ServeOptions(), NAMES).logprobs is None


def test_a_logit_bias_outside_the_vocabulary_is_refused():
    req = parse_generation(CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"49152": 1}},
                           ServeOptions(), NAMES)
    with pytest.raises(ApiError) as e:
        check_bias_ids(req, 49152)
    assert (e.value.status, e.value.code) == (400, "invalid_value") and "49152" in e.value.message
    check_bias_ids(req, 49153)


def test_logprob_reports_in_openai_shapes():
    toks = [Token(5, Status.ACCEPTED, -0.5, ((5, -0.5), (9, -1.5))), Token(6, Status.REJECTED),
            Token(7, Status.CORRECTED, -2.0, ((8, -0.25), (7, -2.0)))]
    names = {5: "Hello", 7: " wor", 8: " world", 9: "Hi"}
    entries = token_logprobs(toks, ["Hello", " wor"], names.__getitem__, offset=10)
    assert [(e.text, e.logprob, e.offset) for e in entries] == [("Hello", -0.5, 10), (" wor", -2.0, 15)]
    chat_shape = choice(CHAT, "Hello wor", "stop", chunk=False, logprobs=entries)["logprobs"]
    assert chat_shape["content"][1] == {"token": " wor", "logprob": -2.0, "bytes": list(b" wor"), "top_logprobs": [
        {"token": " world", "logprob": -0.25, "bytes": list(b" world")}, {"token": " wor", "logprob": -2.0,
                                                                        "bytes": list(b" wor")}]}
    text_shape = choice(TEXT, "Hello wor", None, chunk=True, logprobs=entries)["logprobs"]
    assert text_shape == {"tokens": ["Hello", " wor"], "token_logprobs": [-0.5, -2.0],
                          "top_logprobs": [{"Hello": -0.5, "Hi": -1.5}, {" world": -0.25, " wor": -2.0}],
                          "text_offset": [10, 15]}
    assert choice(CHAT, "x", None, chunk=True)["logprobs"] is None  # not asked for


@pytest.mark.parametrize("raw", [b"{nope", b"[1, 2]", b"\xff"])
def test_bad_json(raw):
    with pytest.raises(ApiError) as e:
        parse_json(raw)
    assert (e.value.status, e.value.code) == (400, "invalid_json")


def test_stop_scanner_holds_back_what_may_start_a_stop_string():
    s = StopScanner(("END", "\n\n"))
    assert [s.feed(p) for p in ("ab", "cE", "N", "x\n", "y")] == ["ab", "c", "", "ENx", "\ny"]
    assert s.flush() == "" and not s.stopped
    s = StopScanner(("END",))
    assert [s.feed(p) for p in ("abE", "NDzz", "more")] == ["ab", "", ""] and s.stopped and s.flush() == ""
    s = StopScanner(("END",))
    assert (s.feed("xEN"), s.flush()) == ("x", "EN")


def test_tally_counts_from_the_events():
    tally = Tally(prompt_tokens=5)
    steps = [Step([Token(1, Status.ACCEPTED), Token(2, Status.REJECTED), Token(3, Status.CORRECTED)], k=2,
                  accepted=1, draft_ms=1.0, verify_ms=10.0),
             Step([Token(4, Status.ACCEPTED), Token(5, Status.ACCEPTED), Token(6, Status.BONUS)], k=2,
                  accepted=2, draft_ms=1.0, verify_ms=10.0)]
    for ev in steps + [Done(5, 5, 0.1, 0.2, "eos", steps=2, accepted_lengths=[1, 2])]:
        tally.add(ev)
    assert tally.usage() == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    spec = tally.speculation("ngram:3", 2)
    assert {k: spec[k] for k in ("steps", "drafted", "accepted", "acceptance", "tokens_per_step")} == \
        {"steps": 2, "drafted": 4, "accepted": 3, "acceptance": 0.75, "tokens_per_step": 2.5}
    assert Tally(3).speculation(None, 4) == {"drafter": None, "k": 0, "steps": 0, "drafted": 0, "accepted": 0,
                                                  "acceptance": None, "tokens_per_step": None, "draft_ms": 0.0,
                                                  "verify_ms": 0.0}


# --- the real model -----------------------------------------------------------------------------


def engine_reply(lm, spec: str, prompt: str, raw: bool) -> dict:
    """What ``generate --temp 0 -n N [--raw] --draft spec --k 4`` decodes: text and counts."""
    from mlxspec.core.engine import generate
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt

    ids = encode_prompt(lm.tokenizer, prompt, raw=raw)
    tally = Tally(len(ids))
    tokens = []
    for ev in generate(lm.model, ids, SamplingParams(), N, set(lm.tokenizer.eos_token_ids), lm.context_length, 0,
                       drafter=make_drafter(spec, lm), k=4):
        tally.add(ev)
        tokens += ev.emitted if isinstance(ev, Step) else []
    import mlx.core as mx

    mx.synchronize()
    return {"text": lm.tokenizer.decode(tokens), "usage": tally.usage(), "tally": tally}


# Requests with logits processors and reported log-probabilities, and the engine's target-only reply to them.
PENALISED = {"presence_penalty": 0.4, "frequency_penalty": 0.3, "repetition_penalty": 1.1}


def engine_logprobs(lm, prompt: str, raw: bool) -> list[tuple[str, float]]:
    """Target-only, greedy, with ``PENALISED``: each token's text alone and log-probability."""
    from mlxspec.core.engine import generate
    from mlxspec.targets.tokenizer import encode_prompt

    ids = encode_prompt(lm.tokenizer, prompt, raw=raw)
    out = [(lm.tokenizer.decode([t.id]), t.logprob)
           for ev in generate(lm.model, ids, SamplingParams(**PENALISED), N, set(lm.tokenizer.eos_token_ids),
                              lm.context_length, 0, logprobs=2) if isinstance(ev, Step) for t in ev.tokens]
    import mlx.core as mx

    mx.synchronize()
    return out


@pytest.fixture(scope="module")
def expected(lm) -> dict:
    """Computed on this thread before any server decodes, so no two threads run MLX at once."""
    out = {(spec, kind): engine_reply(lm, spec, CHAT_PROMPT if kind == CHAT else TEXT_PROMPT, kind == TEXT)
           for spec in ("none", "ngram:3") for kind in (CHAT, TEXT)}
    out |= {("logprobs", kind): engine_logprobs(lm, CHAT_PROMPT if kind == CHAT else TEXT_PROMPT, kind == TEXT)
            for kind in (CHAT, TEXT)}
    return out


@pytest.fixture(scope="module")
def ngram_server(lm, expected):
    from mlxspec.serve import start_server

    server = start_server(ServeOptions(draft="ngram:3", k=4, port=0), loaded=lm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.close()


@pytest.fixture(scope="module")
def parallel_server():
    """The real default model on torch, decoding several requests together (``--parallel``'s default)."""
    pytest.importorskip("greenlet", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")
    from mlxspec.serve import start_server

    server = start_server(ServeOptions(draft="ngram:3", k=4, port=0, backend="torch"), log=lambda line: None)
    assert server.decoder.parallel > 1
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.close()


@pytest.fixture(scope="module")
def cli_server():
    """``mlxspec serve -d none --port 0`` as a user runs it; stopped with Ctrl-C (SIGINT). Yields
    its URL, the process and the lines it has written to stderr so far: a thread reads them as
    they come, so a server that logs more than a pipe holds never blocks on a full pipe."""
    # -X faulthandler: a SIGABRT makes it print every thread's stack (see the test's timeout).
    # SIGINT as a terminal leaves it: a suite started in the background (`cmd &` in a script)
    # ignores SIGINT, and a child inherits an ignored signal, so Ctrl-C would never reach it. A
    # handled one becomes the default in the child, so the suite handles SIGINT while it forks.
    # (Not preexec_fn: Python code between fork and exec can deadlock in a process with threads,
    # and this one has the other servers' threads; that hung a CI run at this fixture.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # --backend mlx: the replies are checked against the MLX engine's (the default here, torch's
        # 4-bit target, is another target: tests/test_int4.py)
        proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "mlxspec.cli", "serve", "-d", "none",
                                 "--backend", "mlx", "--port", "0", "--temp", "0"], stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    line = proc.stderr.readline()
    url = re.search(r"on (http://127\.0\.0\.1:\d+/v1) ", line)
    assert url, line + proc.stderr.read()
    lines = [line]
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    yield url.group(1), proc, lines
    if proc.poll() is None:
        proc.kill()
    reader.join(timeout=10)


def client(url: str):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def chat(c, stream: bool, **kw):
    return c.chat.completions.create(model="default", messages=[{"role": "user", "content": CHAT_PROMPT}],
                                     max_tokens=N, temperature=0, stream=stream, **kw)


def streamed(chunks, kind: str) -> tuple[str, list, list]:
    """Text, the chunks' extension token lists and the chunks themselves."""
    chunks = list(chunks)
    text = "".join((c.choices[0].delta.content or "") if kind == CHAT else c.choices[0].text
                   for c in chunks if c.choices)
    tokens = [t for c in chunks for t in (c.model_extra.get("mlxspec") or {}).get("tokens", [])]
    return text, tokens, chunks


def check_speculation(got: dict, tally: Tally, drafter: str | None) -> None:
    want = tally.speculation(drafter, 4)
    assert {k: got[k] for k in ("drafter", "k", "steps", "drafted", "accepted", "acceptance", "tokens_per_step")} == \
        {k: want[k] for k in ("drafter", "k", "steps", "drafted", "accepted", "acceptance", "tokens_per_step")}


def check_server(url: str, expected: dict, spec: str) -> None:
    """Streamed and whole chat and text completions: the engine's greedy text, usage and counts."""
    drafter = None if spec == "none" else spec
    c = client(url)
    want = expected[(spec, CHAT)]
    assert want["text"] == expected[("none", CHAT)]["text"]  # greedy speculation is target-only output

    whole = chat(c, stream=False)
    assert whole.choices[0].message.content == want["text"]
    assert {k: getattr(whole.usage, k) for k in want["usage"]} == want["usage"]
    check_speculation(whole.model_extra["speculation"], want["tally"], drafter)

    text, tokens, chunks = streamed(chat(c, stream=True, extra_body={"mlxspec": {"token_status": True}}), CHAT)
    assert text == want["text"]
    assert "".join(t["text"] for t in tokens if t["status"] != "rejected") == want["text"]
    statuses = {t["status"] for t in tokens}
    # A drafter's steps are plain too when it proposes nothing (prompt lookup finds no match).
    assert statuses == {"plain"} if drafter is None else "accepted" in statuses <= {s.value for s in Status}
    last = chunks[-1]  # without stream_options.include_usage the finishing chunk carries the counts
    assert last.choices[0].finish_reason in ("stop", "length")
    assert {k: getattr(last.usage, k) for k in want["usage"]} == want["usage"]
    check_speculation(last.model_extra["speculation"], want["tally"], drafter)

    want = expected[(spec, TEXT)]
    whole = c.completions.create(model="default", prompt=TEXT_PROMPT, max_tokens=N, temperature=0)
    assert whole.choices[0].text == want["text"]
    assert whole.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    check_speculation(whole.model_extra["speculation"], want["tally"], drafter)
    text, _, chunks = streamed(c.completions.create(model="default", prompt=TEXT_PROMPT, max_tokens=N,
                                                    temperature=0, stream=True,
                                                    stream_options={"include_usage": True}), TEXT)
    assert text == want["text"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == want["usage"]["completion_tokens"]


@pytest.mark.model
@client_tests
def test_ngram_server_matches_the_engine(ngram_server, expected):
    check_server(ngram_server.url, expected, "ngram:3")
    assert sum(expected[("ngram:3", CHAT)]["tally"].accepted) > 0  # the prompts exercise speculation


@pytest.mark.model
@client_tests
def test_logprobs_in_openai_shapes_match_target_only(ngram_server, expected):
    """With penalties on and a drafter (ngram:3, K=4), the reported tokens and log-probabilities
    are target-only decoding's, whole and streamed, chat and completions."""
    c = client(ngram_server.url)
    want = expected[("logprobs", CHAT)]
    whole = chat(c, stream=False, logprobs=True, top_logprobs=2, extra_body=PENALISED)
    got = [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-3)
    assert "".join(t for t, _ in got) == whole.choices[0].message.content
    first = whole.choices[0].logprobs.content[0]
    assert len(first.top_logprobs) == 2 and first.top_logprobs[0].token == first.token
    assert first.bytes == list(first.token.encode())
    assert whole.model_extra["speculation"]["accepted"] > 0  # drafts were verified with the penalties on
    chunks = list(chat(c, stream=True, logprobs=True, top_logprobs=2, extra_body=PENALISED))
    streamed_lp = [(e.token, e.logprob) for ch in chunks if ch.choices and ch.choices[0].logprobs
                   for e in ch.choices[0].logprobs.content]
    assert streamed_lp == got

    want = expected[("logprobs", TEXT)]
    text = c.completions.create(model="default", prompt=TEXT_PROMPT, max_tokens=N, temperature=0, logprobs=2,
                                extra_body=PENALISED)
    lp = text.choices[0].logprobs
    assert lp.tokens == [t for t, _ in want]
    assert lp.token_logprobs == pytest.approx([v for _, v in want], abs=1e-3)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(alts) <= 2 for alts in lp.top_logprobs)
    chunks = list(c.completions.create(model="default", prompt=TEXT_PROMPT, max_tokens=N, temperature=0, logprobs=2,
                                       stream=True, extra_body=PENALISED))
    assert [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens] \
        == lp.tokens
    plain = chat(c, stream=False)  # nothing asked for: no logprobs
    assert plain.choices[0].logprobs is None


@pytest.mark.model
@client_tests
def test_health_says_ok(ngram_server):
    u = urlparse(ngram_server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    health = json.loads(resp.read())
    assert resp.status == 200 and health.pop("prompt_cache").keys() == {"entries", "bytes", "hits", "misses"}
    assert health == {"status": "ok", "model": ngram_server.info.name, "queued": 0, "decoding": 0, "parallel": 1}
    conn.close()


@pytest.mark.model
@client_tests
def test_models_lists_the_served_model(ngram_server):
    models = client(ngram_server.url).models.list().data
    assert [m.id for m in models] == ["smollm2-135m-instruct"]


def raw_post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", u.path + path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


@pytest.mark.model
@client_tests
def test_bad_requests_get_errors_and_the_server_keeps_answering(ngram_server):
    url = ngram_server.url
    c = client(url)
    status, body = raw_post(url, "/chat/completions", b"{not json")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="default", messages=[])
    assert e.value.code == "missing_messages"
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="default", prompt="word " * 9000, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    status, body = raw_post(url, "/completions", b"{}", {"Content-Length": str(64 << 20)})
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = raw_post(url, "/nowhere", b"{}")
    assert status == 404 and body["error"]["code"] == "not_found"
    vocab = ngram_server.info.vocab_size
    for bad in (999999, -1, vocab, 2**63):  # 999999 once ended the process with SIGSEGV
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="default", prompt=[1, bad], max_tokens=4)
        assert e.value.code == "invalid_prompt" and f"token id {bad} is outside the vocabulary" in e.value.message
    assert c.completions.create(model="default", prompt=[vocab - 1], max_tokens=1, temperature=0).usage.prompt_tokens == 1
    reply = c.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}],
                                      max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens <= 3 and reply.choices[0].message.content


@pytest.mark.model
@client_tests
def test_a_client_leaving_mid_stream_stops_decoding_not_the_server(ngram_server, expected):
    c = client(ngram_server.url)
    before = ngram_server.decoder.cancelled
    stream = c.completions.create(model="default", prompt="Once upon a time", max_tokens=2000, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    deadline = time.monotonic() + 20
    while ngram_server.decoder.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ngram_server.decoder.cancelled == before + 1
    # The next request decodes at once, and a stop string cuts the reply just before it.
    ref = expected[("ngram:3", TEXT)]["text"]
    stop = ref[len(ref) // 2: len(ref) // 2 + 3]
    reply = c.completions.create(model="default", prompt=TEXT_PROMPT, max_tokens=N, temperature=0, stop=[stop])
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].text == ref[: ref.find(stop)]


@pytest.mark.model
@client_tests
def test_cli_server_target_only_then_ctrl_c(cli_server, expected):
    url, proc, stderr = cli_server
    assert [m.id for m in client(url).models.list().data] == ["smollm2-135m-instruct"]
    check_server(url, expected, "none")
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # say where it hangs
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=10)
        time.sleep(1)
        pytest.fail("the server did not stop within 30 s of Ctrl-C; its stderr, every thread's stack last:\n"
                    + "".join(stderr))
    assert code == 0
    deadline = time.monotonic() + 10  # the reader thread takes the last lines after the exit
    while not any("stopping" in ln for ln in stderr) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("stopping" in ln for ln in stderr), "".join(stderr)


@pytest.mark.model
@client_tests
def test_a_tree_server_decodes_the_targets_greedy_text(lm, expected):
    """``serve --tree 2x2``: every request drafts trees, and greedy text is still the target's."""
    from mlxspec.core.tree import parse_tree
    from mlxspec.serve import start_server

    server = start_server(ServeOptions(draft="ngram:3", tree=parse_tree("2x2"), port=0), loaded=lm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        reply = client(server.url).chat.completions.create(
            model="default", messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=N, temperature=0)
        assert reply.choices[0].message.content == expected[("none", CHAT)]["text"]
        assert reply.model_extra["speculation"]["drafter"] == "ngram:3"
        assert reply.model_extra["speculation"]["k"] == "tree 2x2"
    finally:
        server.shutdown()
        server.close()


# --- HTTP as raw clients speak it ---------------------------------------------------------------


def give_up(url: str, body: dict, after: float) -> None:
    """POST ``body`` to /completions, wait ``after`` seconds, hang up as a client that gave up."""
    u = urlparse(url)
    data = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port)) as s:
        s.sendall(f"POST {u.path}/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Length: {len(data)}\r\n\r\n"
                  .encode() + data)
        time.sleep(after)


def raw_exchange(url: str, data: bytes, wait: float = 30.0) -> tuple[int, dict, dict]:
    """Send ``data`` on a fresh connection; the status, headers and JSON body of the first reply."""
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=wait) as s:
        s.sendall(data)
        f = s.makefile("rb")
        status = int(f.readline().split()[1])
        headers = {}
        while (line := f.readline().strip()):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        n = 0 if data.startswith(b"HEAD ") else int(headers.get("content-length", 0))  # HEAD: headers only
        return status, headers, json.loads(f.read(n)) if n else {}


@pytest.mark.model
@client_tests
@pytest.mark.parametrize("method, path, status, allow", [
    ("PUT", "/v1/chat/completions", 405, "POST"), ("DELETE", "/v1/completions", 405, "POST"),
    ("PATCH", "/v1/models", 405, "GET"), ("OPTIONS", "/v1/models/x", 405, "GET"),
    ("GET", "/v1/chat/completions", 405, "POST"), ("POST", "/v1/models", 405, "GET"),
    ("PUT", "/nowhere", 404, None), ("BREW", "/v1/models", 501, None),
])
def test_every_method_gets_a_json_answer_with_allow(ngram_server, method, path, status, allow):
    host = urlparse(ngram_server.url).netloc
    status_got, headers, body = raw_exchange(
        ngram_server.url, f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2\r\n\r\n{{}}".encode())
    assert status_got == status and body["error"]["message"]
    assert headers.get("allow") == allow and headers["content-type"] == "application/json"


@pytest.mark.model
@client_tests
def test_malformed_http_gets_json_errors_and_the_server_keeps_answering(ngram_server, monkeypatch):
    from mlxspec.serve.server import Handler

    url, host = ngram_server.url, urlparse(ngram_server.url).netloc
    status, headers, body = raw_exchange(url, f"HEAD /v1/models HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert status == 405 and headers["allow"] == "GET" and body == {}  # a HEAD reply has no body
    status, _, body = raw_exchange(url, b"\x16\x03\x01 garbage\r\n\r\n")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    chunked = json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0}).encode()
    status, _, body = raw_exchange(url, (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked"
                                         f"\r\nContent-Type: application/json\r\n\r\n{len(chunked):x}\r\n").encode()
                                   + chunked + b"\r\n0\r\n\r\n")
    assert status == 200 and body["usage"]["completion_tokens"] <= 2
    big = b"x" * (9 << 20)  # over the limit, sent whole: the client still reads the refusal
    status, headers, body = raw_exchange(url, f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: "
                                              f"{len(big)}\r\n\r\n".encode() + big)
    assert status == 413 and body["error"]["code"] == "request_too_large" and headers["connection"] == "close"
    surrogate = b'{"messages": [{"role": "user", "content": "\\ud800 hi"}], "max_tokens": 2}'
    status, _, body = raw_exchange(url, f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: "
                                        f"{len(surrogate)}\r\n\r\n".encode() + surrogate)
    assert status == 400 and "lone UTF-16 surrogate" in body["error"]["message"]
    monkeypatch.setattr(Handler, "timeout", 1.0)
    status, _, body = raw_exchange(url, f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: 100"
                                        f"\r\n\r\n{{\"prompt\"".encode(), wait=10)  # 100 bytes promised, 9 sent
    assert status == 408 and body["error"]["code"] == "request_timeout"
    reply = client(url).completions.create(model="default", prompt="Hi", max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens <= 2


@pytest.mark.model
@client_tests
def test_a_client_leaving_a_whole_request_stops_its_decoding(ngram_server):
    url = ngram_server.url
    before = ngram_server.decoder.cancelled
    give_up(url, {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0}, after=1.0)
    reply = client(url).completions.create(model="default", prompt="Hi", max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens <= 2
    assert ngram_server.decoder.cancelled == before + 1  # the 2,000 tokens were not decoded first


@pytest.mark.model
@client_tests
def test_a_client_leaving_during_a_long_prompt_frees_the_server_within_a_chunk(ngram_server):
    """A 2,600-token prompt takes the MLX target about 10 s; its client leaves after 1 s. The
    prompt is given up at the next chunk boundary, so a short request after it is answered
    long before the abandoned prompt would have been done."""
    url = ngram_server.url
    before, prefills = ngram_server.decoder.cancelled, ngram_server.decoder.interrupted_prefills
    give_up(url, {"prompt": "the cat sat on the mat and " * 370, "max_tokens": 4, "temperature": 0}, after=1.0)
    reply = client(url).completions.create(model="default", prompt="Hi", max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens <= 2
    assert ngram_server.decoder.cancelled == before + 1
    assert ngram_server.decoder.interrupted_prefills == prefills + 1  # stopped inside its prompt


@pytest.mark.model
@client_tests
def test_a_long_prompt_lets_a_short_request_behind_it_run_between_its_chunks(ngram_server):
    """A 1,050-token prompt (three chunks) takes the MLX target a few seconds; a short request sent
    half a second after it is answered at its next chunk boundary, before the long one ends, with
    its solo reply; the long one's reply is its own."""
    url = ngram_server.url
    alone = client(url).completions.create(model="default", prompt="Hi", max_tokens=4, temperature=0)
    long_prompt = "Side by side: " + "the cat sat on the mat and " * 150  # in no kept cache yet
    done: dict[str, tuple[float, str]] = {}

    def long_request():
        r = client(url).completions.create(model="default", prompt=long_prompt, max_tokens=3, temperature=0)
        done["long"] = (time.perf_counter(), r.choices[0].text)

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(0.5)
    short = client(url).completions.create(model="default", prompt="Hi", max_tokens=4, temperature=0)
    done["short"] = (time.perf_counter(), short.choices[0].text)
    thread.join(timeout=300)
    assert done["short"][0] < done["long"][0]  # not held for the long prompt's whole length
    again = client(url).completions.create(model="default", prompt=long_prompt, max_tokens=3, temperature=0)
    assert done["short"][1] == alone.choices[0].text and done["long"][1] == again.choices[0].text


@pytest.mark.model
@client_tests
@pytest.mark.parametrize("serving", ["ngram_server", "parallel_server"])
def test_a_retry_of_a_prompt_given_up_resumes_from_its_chunks(serving, request):
    """A client gives up a 1,050-token prompt after 1 s and sends it again at once, as a client
    library's retry does: the retry waits for the first to be given up (it does not run beside
    it from nothing), then starts from the chunks it prefilled, with the reply of a clean run;
    one request at a time (MLX) and several together (torch)."""
    server = request.getfixturevalue(serving)
    url = server.url
    cache = server.decoder.prompt_cache
    prompt = "Retried: " + "the cat sat on the mat and " * 150
    give_up(url, {"prompt": prompt, "max_tokens": 3, "temperature": 0}, after=1.0)
    hits = cache.hits
    retry = client(url).completions.create(model="default", prompt=prompt, max_tokens=3, temperature=0)
    assert cache.hits == hits + 1  # it started from the given-up prompt's chunks
    cache.clear()
    clean = client(url).completions.create(model="default", prompt=prompt, max_tokens=3, temperature=0)
    assert retry.choices[0].text == clean.choices[0].text


@pytest.fixture(scope="module")
def guarded_server(lm):
    from mlxspec.serve import start_server
    from mlxspec.serve.access import Access

    access, lines = Access("sekret", ("http://localhost:3000",)), []
    server = start_server(ServeOptions(port=0, max_tokens=4, access=access), loaded=lm, log=lines.append)
    server.lines = lines
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.close()


def exchange(server, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict, dict]:
    host = urlparse(server.url).netloc
    lines = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, "Content-Length": str(len(body)), **headers}.items())
    return raw_exchange(server.url, f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body)


@pytest.mark.model
@client_tests
def test_an_api_key_guards_every_route_but_health(guarded_server):
    key = {"Authorization": "Bearer sekret"}
    chat_body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    for method, path, body in (("GET", "/v1/models", b""), ("GET", "/v1/models/default", b""),
                               ("POST", "/v1/chat/completions", chat_body)):
        status, headers, err = exchange(guarded_server, method, path, {}, body)
        assert status == 401 and err["error"]["code"] == "invalid_api_key" and headers["www-authenticate"] == "Bearer"
        assert exchange(guarded_server, method, path, {"Authorization": "Bearer wrong"}, body)[0] == 401
        assert exchange(guarded_server, method, path, key, body)[0] == 200
    assert exchange(guarded_server, "GET", "/health", {})[0] == 200
    reply = openai.OpenAI(base_url=guarded_server.url, api_key="sekret", max_retries=0).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert reply.choices[0].message.content
    logged = [ln for ln in guarded_server.lines if "/v1/chat/completions:" in ln]
    assert logged and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d /v1/chat/completions: \d+ prompt \+ \d+ completion "
                               r"tokens in \d+\.\d\d s \((stop|length)\)", logged[-1]), logged
    with pytest.raises(openai.AuthenticationError):
        client(guarded_server.url).models.list()


@pytest.mark.model
@client_tests
def test_a_browser_from_an_allowed_origin_gets_cors_headers_and_others_none(guarded_server):
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    status, headers, _ = exchange(guarded_server, "OPTIONS", "/v1/chat/completions",
                                  {"Origin": "http://localhost:3000", **ask})
    assert status == 204 and headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "authorization, content-type"
    status, headers, _ = exchange(guarded_server, "OPTIONS", "/v1/chat/completions", {"Origin": "http://evil.test", **ask})
    assert status == 204 and not any(h.startswith("access-control-") for h in headers)
    key = {"Authorization": "Bearer sekret"}
    _, headers, _ = exchange(guarded_server, "GET", "/v1/models", {"Origin": "http://localhost:3000", **key})
    assert headers["access-control-allow-origin"] == "http://localhost:3000" and headers["vary"] == "Origin"
    _, headers, _ = exchange(guarded_server, "GET", "/v1/models", {"Origin": "http://evil.test", **key})
    assert "access-control-allow-origin" not in headers


def test_a_long_prefill_logs_its_progress_and_stops_when_asked():
    """``prefill_watch``, the decoder's ``interrupt``: a line every ``every`` chunks (how many
    tokens in how long), and True once the request is to be given up."""
    from mlxspec.core.prefill import PREFILL_CHUNK
    from mlxspec.serve.decoder import prefill_watch

    lines, stop, now = [], [False], iter(range(100))
    watch = prefill_watch(lambda: stop[0], 5000, lines.append, every=2, clock=lambda: float(next(now)))
    assert [watch() for _ in range(3)] == [False] * 3 and len(lines) == 1
    assert lines[0].endswith(f"prefilling a 5000-token prompt: {2 * PREFILL_CHUNK} tokens in 1.0 s "
                             f"({2 * PREFILL_CHUNK} tok/s)")
    stop[0] = True
    assert watch() and len(lines) == 2 and f"{4 * PREFILL_CHUNK} tokens in 2.0 s" in lines[1]
