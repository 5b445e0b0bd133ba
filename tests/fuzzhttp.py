"""Seeded random HTTP requests for fuzzing ``mlxspec serve``: methods, paths, headers and bodies
from valid through mutated to garbage, each a complete byte string to send on its own connection."""

from __future__ import annotations

import json
import random
import socket

METHODS = ["GET", "POST", "POST", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW", "get", ""]
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/x", "/v1/models/default", "/",
         "/v1/chat/completions/", "/v1/completions?x=1", "/%ff", "/" + "a" * 3000, "*", "/v1/../etc"]
FIELDS = {"model": ["default", "gpt-4o", "", 7, None], "max_tokens": [1, 3, 0, -1, 10**30, 2.5, "3", None, True],
          "temperature": [0, 0.7, -1, 1e308, float("inf"), float("nan"), "hot", None],
          "top_p": [1, 0.5, 0, 2, -0.1, None], "seed": [0, -1, 2**70, "x", 1.5], "stream": [False, True, "yes", 1],
          "stop": ["\n", ["a", "b"], ["x"] * 9, [1], "", None], "n": [1, 2, 0],
          "mlxspec": [{"token_status": True}, {"token_status": "yes"}, [], None],
          "top_k": [0, 5, -1, 10**9, "3"], "min_p": [0, 0.1, 1.5, None],
          "repetition_penalty": [0, 1, 1.3, -1, 1e308, float("inf"), "x"],
          "repetition_context_size": [1, 20, 0, 10**9, 2.5], "presence_context_size": [1, 20, -3],
          "presence_penalty": [0, 1.5, -2, 3, float("nan"), "x"], "frequency_penalty": [0, 0.7, -2.5, True],
          "logit_bias": [{}, {"5": 10}, {"5": 101}, {"x": 1}, {"-1": 1}, {"99999999999": 1}, {"9" * 5000: 1}, {"05": 1, "5": 2},
                         {"7": "a"}, [], "5"],
          "logprobs": [True, False, 0, 3, 5, 21, -1, "yes"], "top_logprobs": [0, 2, 20, 21, -1, "2", None]}
TEXTS = ["Hi", "", " ", "\ud800 lone surrogate", "word " * 3000, "\x00\x01", "日本語", "a" * 20]


def _value(rng: random.Random) -> object:
    return rng.choice([None, True, 0, -1, 2**64, 1e308, "", "x" * rng.randint(0, 50), [], {}, [1, "a"], {"a": 1}])


def _messages(rng: random.Random) -> object:
    roles = ["user", "system", "assistant", "wizard", "", 3]
    shape = rng.random()
    if shape < 0.6:
        return [{"role": rng.choice(roles[:3]), "content": rng.choice(TEXTS)} for _ in range(rng.randint(1, 3))]
    if shape < 0.8:
        return [{"role": rng.choice(roles), "content": rng.choice([None, 5, [], [{"type": "text", "text": "hi"}]])}]
    return rng.choice(["hi", [], [1, 2], {"role": "user"}, None])


def _prompt(rng: random.Random) -> object:
    return rng.choice([rng.choice(TEXTS), [rng.randint(-5, 60000) for _ in range(rng.randint(0, 5))],
                       [[1, 2]], ["a", "b"], None, 12, {"x": 1}])


def body(rng: random.Random, path: str) -> bytes:
    """A JSON body for ``path``: fields from the API with valid, wrong-typed and out-of-range values."""
    obj: dict = {"max_tokens": rng.choice([1, 2, 3])}  # bounded unless a mutation says otherwise
    obj["messages" if "chat" in path else "prompt"] = _messages(rng) if "chat" in path else _prompt(rng)
    for name in rng.sample(sorted(FIELDS), rng.randint(0, 4)):
        obj[name] = rng.choice(FIELDS[name])
    if rng.random() < 0.2:
        obj[rng.choice(["logprobs", "echo", "x" * 10, "top_k", "🙂"])] = _value(rng)
    if rng.random() < 0.1:
        del obj[rng.choice(sorted(obj))]
    if isinstance(obj.get("max_tokens"), int) and not isinstance(obj["max_tokens"], bool) and obj["max_tokens"] > 3:
        obj["max_tokens"] = 3 if rng.random() < 0.9 else obj["max_tokens"]  # a rare long one stays
    raw = json.dumps(obj).encode("utf-8", "surrogatepass")
    mutate = rng.random()
    if mutate < 0.1:  # a few bytes flipped
        raw = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        raw = bytes(raw)
    elif mutate < 0.15:
        raw = raw[: rng.randrange(len(raw))]
    elif mutate < 0.2:
        raw = rng.randbytes(rng.randint(0, 200))
    return raw


def valid(rng: random.Random, host: str) -> bytes:
    """A request the server should answer 200: a chat or text completion, sometimes streamed."""
    chat = rng.random() < 0.5
    obj: dict = {"max_tokens": rng.randint(1, 3), "temperature": rng.choice([0, 0.5, 1.0]), "seed": rng.randint(0, 9),
                 "stream": rng.random() < 0.3}
    if rng.random() < 0.3:  # the logits processors and reported log-probabilities, within their ranges
        obj |= {"repetition_penalty": rng.choice([1.0, 1.2]), "presence_penalty": rng.choice([0, 0.5, -1]),
                "frequency_penalty": rng.choice([0, 1.0]), "logit_bias": rng.choice([{}, {"17": -100}, {"5": 3.5}]),
                "logprobs": True, "top_logprobs": rng.randint(0, 3)}
    if chat:
        obj["messages"] = [{"role": "user", "content": rng.choice(["Hi", "What is 2+2?", "日本語", "a" * 20])}]
    else:
        obj["prompt"] = rng.choice(["Once upon a time", [1, 2, 3], "x"])
    data = json.dumps(obj).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def request(rng: random.Random, host: str) -> bytes:
    """One whole request: a third valid, the rest with a fuzzed body or broken at the HTTP level."""
    kind = rng.random()
    if kind < 0.33:
        return valid(rng, host)
    if kind < 0.38:
        return rng.randbytes(rng.randint(1, 300)) + b"\r\n\r\n"
    method, path = rng.choice(METHODS), rng.choice(PATHS)
    data = body(rng, path) if method.upper() in ("POST", "PUT", "PATCH") or rng.random() < 0.1 else b""
    headers = {"Host": host, "Content-Type": rng.choice(["application/json", "text/plain", "x/y"])}
    framing = rng.random()
    if framing < 0.8:
        headers["Content-Length"] = str(len(data))
    elif framing < 0.85:
        headers["Content-Length"] = rng.choice(["-1", "abc", str(10**12), str(len(data) + 5)])
    elif framing < 0.9:
        headers["Transfer-Encoding"] = "chunked"
        data = (f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n") if rng.random() < 0.8 else b"zz\r\n" + data
    if rng.random() < 0.05:
        headers["X-" + "h" * rng.randint(1, 20)] = "v" * rng.randint(0, 5000)
    version = rng.choice(["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/9.9"])
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("utf-8", "surrogatepass") + data


def exchange(address: tuple[str, int], data: bytes, timeout: float) -> tuple[int | None, dict[str, str], bytes]:
    """Send ``data`` and read the first answer: its status (None if the server closed without
    one), headers and body (``Content-Length`` bytes, or up to the close for a stream). A server
    that stays silent past ``timeout`` raises ``TimeoutError``: a hang."""
    with socket.create_connection(address, timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # refused before everything was read: its answer is still there
        f = s.makefile("rb")
        try:
            status_line = f.readline()
        except ConnectionResetError:
            return None, {}, b""
        if not status_line.startswith(b"HTTP/"):
            return None, {}, status_line
        headers = {}
        while (line := f.readline().strip()):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if data.split(b" ", 1)[0] == b"HEAD":
            return int(status_line.split()[1]), headers, b""
        n = headers.get("content-length")
        rest = f.read(int(n)) if n is not None else f.read()
        return int(status_line.split()[1]), headers, rest
