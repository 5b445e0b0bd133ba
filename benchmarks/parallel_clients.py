"""Several clients at once: how long do c concurrent requests take against the same requests
one after another, on one server? (issue 39's goal: 4 clients of 64-token replies in <= 0.5x the
time, each reply identical to its solo greedy reply)

Starts ``mlxspec serve``'s server in this process on the default model and drafter (torch where
it runs; ``--parallel`` as given, default the server's), then for each client count c: the first
c prompts (held-out, or short ones whose prefill is next to nothing) sent one after another, then
all at once from c threads, alternating, each ``--repeats`` times (after a warm-up); medians,
their ratio, aggregate tokens/s, and whether every concurrent reply equals its solo reply (greedy).

    python benchmarks/parallel_clients.py [--prompts heldout|short] [--clients 1 2 4] [--tokens 64] [--repeats 3]
                                          [--parallel N] [--draft SPEC] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.serve import ServeOptions
from mlxspec.serve.server import start_server

HELDOUT = "prompts/heldout-8.jsonl"  # beside this script: 55-205 prompt tokens each
SHORT = ["Write a haiku about the sea.", "What is 17 times 23?", "List three uses of copper.",
         "Explain recursion briefly."]  # 5-8 tokens each: decoding alone, next to no prefill


@dataclass(frozen=True)
class ClientsRow:
    clients: int
    serial_s: float  # median: the c requests one after another
    concurrent_s: float  # median: the c requests at once
    ratio: float  # concurrent_s / serial_s
    tokens: int  # new tokens of the c replies
    serial_tok_s: float
    concurrent_tok_s: float
    identical: bool  # every concurrent reply equal to its solo one, in every repeat


@dataclass(frozen=True)
class ParallelClients:
    date: str
    parallel: int
    prompts: str  # heldout or short
    draft: str
    max_tokens: int
    repeats: int
    rows: list[ClientsRow]


def first(prompts: list[list[dict]], c: int) -> list[list[dict]]:
    """The first ``c`` prompts; past the last, the first ones again, numbered so that each differs."""
    return [p if i < len(prompts) else [{**p[0], "content": f"{p[0]['content']} ({i // len(prompts) + 1})"}]
            for i, p in enumerate(prompts[i % len(prompts)] for i in range(c))]


def ask(url: str, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        reply = json.loads(r.read())
    return reply["choices"][0]["message"]["content"], reply["usage"]["completion_tokens"]


def serially(url: str, prompts: list[list[dict]], n: int) -> tuple[float, list[tuple[str, int]]]:
    t0 = time.perf_counter()
    out = [ask(url, p, n) for p in prompts]
    return time.perf_counter() - t0, out


def concurrently(url: str, prompts: list[list[dict]], n: int) -> tuple[float, list[tuple[str, int]]]:
    out: list = [None] * len(prompts)

    def one(i: int) -> None:
        out[i] = ask(url, prompts[i], n)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def measure(url: str, prompts: list[list[dict]], n: int, repeats: int) -> ClientsRow:
    serial, concurrent, identical = [], [], True
    for _ in range(repeats):
        s, solo = serially(url, prompts, n)
        c, together = concurrently(url, prompts, n)
        serial.append(s)
        concurrent.append(c)
        identical &= solo == together
    s, c, tokens = statistics.median(serial), statistics.median(concurrent), sum(t for _, t in solo)
    return ClientsRow(len(prompts), round(s, 2), round(c, 2), round(c / s, 3), tokens, round(tokens / s, 1),
                      round(tokens / c, 1), identical)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=None)
    ap.add_argument("--draft", default="ngram:3+smollm2-135m-eagle")
    ap.add_argument("--prompts", choices=["heldout", "short"], default="heldout")
    ap.add_argument("--out")
    args = ap.parse_args()

    if args.prompts == "short":
        texts = SHORT
    else:
        texts = [json.loads(line)["turns"][0] for line in (Path(__file__).parent / HELDOUT).read_text().splitlines()]
    prompts = [[{"role": "user", "content": t}] for t in texts]
    server = start_server(ServeOptions(draft=args.draft, backend="auto", port=0, parallel=args.parallel),
                          log=lambda line: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        serially(server.url, prompts[:2], 8)  # warm-up
        rows = []
        for c in args.clients:
            rows.append(row := measure(server.url, first(prompts, c), args.tokens, args.repeats))
            print(f"{c} clients: one after another {row.serial_s:.2f} s, together {row.concurrent_s:.2f} s "
                  f"({row.ratio:.2f}x), {row.concurrent_tok_s:.0f} tok/s in all; replies identical: {row.identical}",
                  flush=True)
        result = ParallelClients(time.strftime("%Y-%m-%d"), server.decoder.parallel, args.prompts, args.draft, args.tokens,
                                 args.repeats, rows)
    finally:
        server.shutdown()
        server.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(asdict(result), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
