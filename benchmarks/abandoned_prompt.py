"""How long does a client that gives up on a long prompt hold the server? (issue 39's goal: a
6,000-token prompt abandoned after 2 s delays the next short request by under 3 s)

Starts ``mlxspec serve``'s server in this process on the default model and drafter (torch where
it runs), then: a short request alone (its latency, median of the repeats); the long prompt to
its end once (how long it would hold the server); and, repeated, the long prompt sent from a raw
socket that closes after ``--after`` seconds, followed at once by the short request, whose
latency less the short request's own is the delay the departed client caused. Last, a client
that gives up after ``--retry-after`` seconds and sends the same prompt again at once, as a
client library's retry does: the server keeps the chunks it prefilled, so the retry takes the
long prompt's time less theirs. And a short request sent ``--after`` seconds into a long prompt
that nobody abandons: the server decodes it between the long prompt's chunks.

    python benchmarks/abandoned_prompt.py [--tokens 6000] [--after 2] [--repeats 3] [--retry-after 20] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.serve import ServeOptions
from mlxspec.serve.server import start_server

FILLER = "the cat sat on the mat and "


@dataclass(frozen=True)
class AbandonedPrompt:
    date: str
    prompt_tokens: int
    abandoned_after_s: float
    long_prompt_s: float  # the long prompt's whole prefill (and one token), had nobody left
    short_alone_s: float  # median latency of the short request on an idle server
    short_after_s: list[float]  # its latency right after each abandonment
    delay_s: float  # median of short_after_s less short_alone_s
    interrupted_prefills: int  # abandoned prompts the server gave up inside their prefill
    retry_after_s: float
    retry_s: float  # the same long prompt sent again right after a client gave it up
    short_during_s: float  # the short request's latency when sent --after s into a long prompt's prefill


def complete(url: str, prompt: str, max_tokens: int) -> float:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        r.read()
    return time.perf_counter() - t0


def abandon(url: str, prompt: str, after: float) -> None:
    """Send the request, wait ``after`` seconds, hang up as a client that gave up."""
    host = urlparse(url)
    body = json.dumps({"prompt": prompt, "max_tokens": 64, "temperature": 0}).encode()
    s = socket.create_connection((host.hostname, host.port))
    s.sendall(f"POST {host.path}/completions HTTP/1.1\r\nHost: {host.netloc}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
              + body)
    time.sleep(after)
    s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=6000)
    ap.add_argument("--after", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--retry-after", type=float, default=20.0)
    ap.add_argument("--out")
    args = ap.parse_args()

    options = ServeOptions(draft="ngram:3+smollm2-135m-eagle", backend="auto", port=0)
    server = start_server(options, log=lambda line: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url, tokenizer = server.url, server.decoder.info.tokenizer
    repeats = max(1, round(args.tokens / len(tokenizer.encode(FILLER * 10)) * 10))
    long_prompt = FILLER * repeats
    n = len(tokenizer.encode(long_prompt))
    try:
        complete(url, "Hi", 2)  # warm-up
        alone = statistics.median(complete(url, "Hi", 2) for _ in range(args.repeats))
        long_s = complete(url, long_prompt + " once more", 1)
        after = []
        for i in range(args.repeats):
            abandon(url, f"Note {i}: " + long_prompt, args.after)  # a new start: no kept cache serves it
            after.append(complete(url, "Hi", 2))
        abandon(url, "Retry: " + long_prompt, args.retry_after)
        retry_s = complete(url, "Retry: " + long_prompt, 1)
        behind = threading.Thread(target=complete, args=(url, "Kept: " + long_prompt, 1))
        behind.start()
        time.sleep(args.after)
        during_s = complete(url, "Hi", 2)
        behind.join()
        result = AbandonedPrompt(time.strftime("%Y-%m-%d"), n, args.after, round(long_s, 2), round(alone, 3),
                                 [round(t, 2) for t in after], round(statistics.median(after) - alone, 2),
                                 server.decoder.interrupted_prefills, args.retry_after, round(retry_s, 2),
                                 round(during_s, 2))
    finally:
        server.shutdown()
        server.close()
    print(f"{n}-token prompt: {long_s:.1f} s to answer; abandoned after {args.after:g} s, the next short request "
          f"waited {result.delay_s:.2f} s more than alone ({alone:.2f} s); "
          f"{result.interrupted_prefills} prompts given up inside their prefill; given up after {args.retry_after:g} s "
          f"and sent again, it took {retry_s:.1f} s; sent {args.after:g} s into another's prefill, the short request "
          f"took {during_s:.2f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(asdict(result), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
