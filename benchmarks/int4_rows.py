"""Whether a better int4 kernel could flatten the quantized target's verify curve: each of a
block's four int4 products (q/k/v fused, o, gate/up fused, down) timed over 1..8 rows and over
16, 32 and 64, with the arithmetic rate each reaches. If the rate at 8 rows is already near the
rate at 64 rows, the products are bound by multiply-adds, not by unpacking the weights, and no
kernel that unpacks each block once for all rows can make 8 rows much cheaper. Beside it, where
a whole target pass's time grows from 1 to 8 tokens, by operation (torch's profiler, CPU time
of each operation itself, a 256-token cache), to weigh the int4 products against the rest.

    .venv/bin/python benchmarks/int4_rows.py [--rounds 9] [--calls 40] [--out FILE.json]

Each round times every (product, rows) once as the median of ``--calls`` calls, in rotating
order; reported: the median over rounds. ``floor``: rows x the time per row at 64 rows, the
cost of these multiply-adds at the kernel's best rate.
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

from mlxspec.core.cache import rewind
from mlxspec.targets import loading
from mlxspec.torchpath.ops import prefill

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
PASS_TOKENS = (1, 4, 5, 8)


@dataclass(frozen=True)
class Product:
    name: str
    out_features: int
    in_features: int
    us: dict[int, float]  # rows -> median microseconds

    def gflops(self, rows: int) -> float:
        return 2 * rows * self.out_features * self.in_features / self.us[rows] / 1e3

    def over_floor(self, rows: int) -> float:
        """Time at ``rows`` over rows x the per-row time at the largest row count timed."""
        top = max(self.us)
        return self.us[rows] / (rows * self.us[top] / top)


def kernels(model: torch.nn.Module) -> dict[str, object]:
    """Layer 0's four int4 products, as the target's pass calls them."""
    block = model.model.layers[0]
    return {"q/k/v": block.self_attn.fused_qkv, "o": block.self_attn.o_proj.kernel,
            "gate/up": block.mlp.fused_gate_up, "down": block.mlp.down_proj.kernel}


def time_call(fn, x: torch.Tensor, calls: int) -> float:
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def measure(model: torch.nn.Module, rounds: int, calls: int) -> list[Product]:
    ks = kernels(model)
    shapes = {name: (sum(m.out_features for m in k.layers), k.layers[0].in_features) for name, k in ks.items()}
    inputs = {(name, r): torch.randn(r, shapes[name][1]) for name in ks for r in ROWS}
    cells = list(inputs)
    times: dict[tuple[str, int], list[float]] = {c: [] for c in cells}
    with torch.inference_mode():
        for c in cells:  # warm-up: packing and first-call costs
            ks[c[0]](inputs[c])
        for rnd in range(rounds):
            shift = rnd * len(cells) // rounds
            for c in cells[shift:] + cells[:shift]:
                times[c].append(time_call(ks[c[0]], inputs[c], calls))
            print(f"round {rnd + 1}/{rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
    return [Product(name, *shapes[name], {r: statistics.median(times[(name, r)]) for r in ROWS}) for name in ks]


def pass_growth(model: torch.nn.Module, rounds: int, passes: int = 10) -> dict[int, dict[str, float]]:
    """Milliseconds per pass of each operation (its own CPU time) over ``PASS_TOKENS`` tokens
    after a 256-token cache, the cache trimmed back after each pass: per round ``passes``
    passes of each length, the lengths in rotating order; the median over rounds."""
    from torch.profiler import profile

    cache = model.make_cache()
    seen: dict[int, list[dict[str, float]]] = {n: [] for n in PASS_TOKENS}
    with torch.inference_mode():
        prefill(model, cache, list(range(1000, 1256)))
        for rnd in range(rounds):
            shift = rnd % len(PASS_TOKENS)
            for n in PASS_TOKENS[shift:] + PASS_TOKENS[:shift]:
                x = torch.arange(2000, 2000 + n)[None]
                for _ in range(3):
                    model(x, cache), rewind(cache, n)
                with profile() as prof:
                    for _ in range(passes):
                        model(x, cache), rewind(cache, n)
                ops: dict[str, float] = {}
                for e in prof.key_averages():
                    ops[e.key] = ops.get(e.key, 0.0) + e.self_cpu_time_total / passes / 1e3
                seen[n].append(ops)
    return {n: {k: statistics.median(r.get(k, 0.0) for r in runs) for k in set().union(*runs)}
            for n, runs in seen.items()}


def growth_report(by_op: dict[int, dict[str, float]], top: int = 8) -> str:
    first, last = PASS_TOKENS[0], PASS_TOKENS[-1]
    grew = sorted(by_op[last], key=lambda k: by_op[first].get(k, 0.0) - by_op[last][k])
    lines = ["| operation (ms a pass) | " + " | ".join(f"{n} tokens" for n in PASS_TOKENS) + " |",
             "|" + "---|" * (len(PASS_TOKENS) + 1)]
    for k in grew[:top]:
        lines.append(f"| {k} | " + " | ".join(f"{by_op[n].get(k, 0.0):.2f}" for n in PASS_TOKENS) + " |")
    lines.append("| all operations (medians summed) | " + " | ".join(f"{sum(by_op[n].values()):.2f}" for n in PASS_TOKENS)
                 + " |")
    return "\n".join(lines)


def report(products: list[Product]) -> str:
    head = "| product (N x K) | " + " | ".join(str(r) for r in ROWS) + " |"
    lines = [head, "|" + "---|" * (len(ROWS) + 1)]
    for p in products:
        lines.append(f"| {p.name} ({p.out_features} x {p.in_features}) us | "
                     + " | ".join(f"{p.us[r]:.0f}" for r in ROWS) + " |")
        lines.append(f"| {p.name} GFLOP/s | " + " | ".join(f"{p.gflops(r):.0f}" for r in ROWS) + " |")
        lines.append(f"| {p.name} time / floor | " + " | ".join(f"{p.over_floor(r):.2f}" for r in ROWS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--out", default=None, help="write the medians as JSON here")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    model = loading.load("default", "quantized", backend="torch:cpu").model
    products = measure(model, args.rounds, args.calls)
    print(report(products))
    by_op = pass_growth(model, max(3, args.rounds // 2))
    print(growth_report(by_op))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load before {load_before:.2f} / after "
          f"{os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "rounds": args.rounds, "calls": args.calls, "load_before": load_before,
                       "load_after": os.getloadavg()[0],
                       "products": [asdict(p) | {"gflops": {r: p.gflops(r) for r in ROWS},
                                                 "over_floor": {r: p.over_floor(r) for r in ROWS}}
                                    for p in products],
                       "pass_ms_by_op": by_op}, f, indent=1)


if __name__ == "__main__":
    main()
