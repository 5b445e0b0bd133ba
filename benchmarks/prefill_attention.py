"""What torch's fused attention would save in prefill: the quantized target's prefill (chunks of
512, the head on the last position only) with the row-invariant ``chunked_attention`` it runs,
against the same prefill with ``F.scaled_dot_product_attention`` swapped in, alternated round by
round in one process.

    .venv/bin/python benchmarks/prefill_attention.py [--rounds 5] [--lengths 100,300,700,1000] [--out FILE.json]

Fused attention is not row-invariant, so adopting it would change the cache's bits (and whether
a prompt prefilled in pieces equals the prompt prefilled at once); this measures whether the
time saved is worth that.
"""

# ruff: noqa: I001
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import torch

from mlxspec.targets import loading
from mlxspec.torchpath import invariant
from mlxspec.torchpath.ops import prefill


@dataclass(frozen=True)
class Row:
    tokens: int
    chunked_s: float  # medians over rounds
    fused_s: float

    @property
    def ratio(self) -> float:
        return self.fused_s / self.chunked_s


def timed_prefill(model: torch.nn.Module, ids: list[int]) -> float:
    cache = model.make_cache()
    t = time.perf_counter()
    with torch.inference_mode():
        prefill(model, cache, ids)
    return time.perf_counter() - t


def measure(lengths: list[int], rounds: int) -> list[Row]:
    model = loading.load("default", "quantized", backend="torch:cpu").model
    attns = [layer.self_attn for layer in model.model.layers]
    own = attns[0].attend
    ids = list(range(100, 100 + max(lengths)))  # token ids of ordinary words; their text does not matter here

    def run(fused: bool, n: int) -> float:
        for a in attns:
            a.attend = invariant.sdpa if fused else own
        try:
            return timed_prefill(model, ids[:n])
        finally:
            for a in attns:
                a.attend = own

    run(False, lengths[0]), run(True, lengths[0])  # warm-up
    times = {(n, f): [] for n in lengths for f in (False, True)}
    for rnd in range(rounds):
        for n in lengths:
            for fused in ((False, True) if rnd % 2 == 0 else (True, False)):
                times[(n, fused)].append(run(fused, n))
        print(f"round {rnd + 1}/{rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
    return [Row(n, statistics.median(times[(n, False)]), statistics.median(times[(n, True)])) for n in lengths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lengths", default="100,300,700,1000", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--out", default=None, help="write the medians as JSON here")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    load_before = os.getloadavg()[0]
    rows = measure(lengths, args.rounds)
    print("| prompt tokens | chunked (s) | fused (s) | fused / chunked |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r.tokens} | {r.chunked_s:.3f} | {r.fused_s:.3f} | {r.ratio:.2f} |")
    print(f"load before {load_before:.2f} / after {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, "load_before": load_before,
                       "load_after": os.getloadavg()[0], "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]},
                      f, indent=1)


if __name__ == "__main__":
    main()
