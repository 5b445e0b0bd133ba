"""Two prefill levers, each measured as an A/B in one process, alternated round by round:

  attention  the quantized torch target's prefill (chunks of 512, the head on the last position
             only) with the row-invariant ``chunked_attention`` it runs (A) against
             ``F.scaled_dot_product_attention`` swapped in (B). Fused attention is not
             row-invariant, so adopting it would change the cache's bits (and whether a prompt
             prefilled in pieces equals the prompt prefilled at once); this measures whether the
             time saved is worth that.
  mlx-head   the MLX target's prefill computing the head over every row of the last chunk (A,
             as before ``Capabilities.logit_rows`` on MLX) against the last row only (B, now).

    .venv/bin/python benchmarks/prefill_levers.py [--lever attention|mlx-head] [--rounds 5]
        [--lengths 100,300,700,1000] [--out FILE.json]
"""

# ruff: noqa: I001
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import mlx.core as mx
import torch

from mlxspec.core.prefill import prefill as mlx_prefill
from mlxspec.targets import loading
from mlxspec.torchpath import invariant
from mlxspec.torchpath.ops import prefill as torch_prefill


@dataclass(frozen=True)
class Row:
    tokens: int
    a_s: float  # medians over rounds
    b_s: float

    @property
    def ratio(self) -> float:
        return self.b_s / self.a_s


LABELS = {"attention": ("chunked", "fused"), "mlx-head": ("every row", "last row")}


def timed_prefill(model: Any, ids: list[int], run_prefill: Callable[..., Any], settle: Callable[[Any], None]) -> float:
    cache = model.make_cache()
    t = time.perf_counter()
    settle(run_prefill(model, cache, ids))
    return time.perf_counter() - t


def attention_ab() -> Callable[[bool, list[int]], float]:
    """Torch, quantized: prefill with the model's own attention (False) or torch's fused one (True)."""
    model = loading.load("default", "quantized", backend="torch:cpu").model
    attns = [layer.self_attn for layer in model.model.layers]
    own = attns[0].attend

    def run(b: bool, ids: list[int]) -> float:
        for a in attns:
            a.attend = invariant.sdpa if b else own
        try:
            with torch.inference_mode():
                return timed_prefill(model, ids, torch_prefill, lambda out: None)
        finally:
            for a in attns:
                a.attend = own

    return run


def mlx_head_ab() -> Callable[[bool, list[int]], float]:
    """MLX, float32: the head over every row of the last chunk (False) or the last row only (True)."""
    model = loading.load("default", "float32", backend="mlx").model
    every_row = replace(type(model).capabilities, logit_rows=False)

    def run(b: bool, ids: list[int]) -> float:
        model.capabilities = type(model).capabilities if b else every_row
        try:
            return timed_prefill(model, ids, mlx_prefill, mx.eval)
        finally:
            del model.capabilities  # the class's again

    return run


def measure(lever: str, lengths: list[int], rounds: int) -> list[Row]:
    run = attention_ab() if lever == "attention" else mlx_head_ab()
    ids = list(range(100, 100 + max(lengths)))  # token ids of ordinary words; their text does not matter here
    run(False, ids[: lengths[0]]), run(True, ids[: lengths[0]])  # warm-up
    times: dict[tuple[int, bool], list[float]] = {(n, b): [] for n in lengths for b in (False, True)}
    for rnd in range(rounds):
        for n in lengths:
            for b in ((False, True) if rnd % 2 == 0 else (True, False)):
                times[(n, b)].append(run(b, ids[:n]))
        print(f"round {rnd + 1}/{rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
    return [Row(n, statistics.median(times[(n, False)]), statistics.median(times[(n, True)])) for n in lengths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lever", choices=sorted(LABELS), default="attention")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lengths", default="100,300,700,1000", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--out", default=None, help="write the medians as JSON here")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    load_before = os.getloadavg()[0]
    rows = measure(args.lever, lengths, args.rounds)
    a, b = LABELS[args.lever]
    print(f"| prompt tokens | {a} (s) | {b} (s) | {b} / {a} |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r.tokens} | {r.a_s:.3f} | {r.b_s:.3f} | {r.ratio:.2f} |")
    print(f"load before {load_before:.2f} / after {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "lever": args.lever, "a": a, "b": b, "rounds": args.rounds,
                       "load_before": load_before, "load_after": os.getloadavg()[0],
                       "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
