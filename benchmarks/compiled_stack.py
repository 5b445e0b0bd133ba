"""How much faster is the compiled target pass than the eager one? (issue 37 item 2)

Times the default's torch pass (its 4-bit layers on the int4 kernel) eager and through the
compiled stack (``mlxspec.torchpath.compiled``, the graphs ``mlxspec models pull`` compiles into the
store; compiled here into it first where missing), in one process, interleaved, at three context
lengths and two pass widths; and checks that the compiled verify rows have the bits of the
compiled one-token passes.

    .venv/bin/python benchmarks/compiled_stack.py [--reps 25] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

# ruff: noqa: I001
import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import torch

from mlxspec.targets import loading
from mlxspec.torchpath import compiled

CONTEXTS = (64, 200, 400)
WIDTHS = (1, 4)


@dataclass(frozen=True)
class Timing:
    context: int
    tokens: int
    eager_ms: float
    compiled_ms: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms


def time_passes(model, stack, reps: int) -> list[Timing]:
    out = []  # no grad mode entered, as the engine calls the target (inference mode speeds the eager pass)
    for ctx in CONTEXTS:
        caches = {}
        for use in (None, stack):
            model.compiled = use
            caches[use] = model.make_cache()
            model(torch.tensor([[100 + i % 5000 for i in range(ctx)]]), caches[use])
        for n in WIDTHS:
            times: dict = {None: [], stack: []}
            for _ in range(reps):  # interleaved: the machine's drift hits both alike
                for use in (None, stack):
                    model.compiled = use
                    start = time.perf_counter()
                    model(torch.tensor([[1234] * n]), caches[use])
                    times[use].append(time.perf_counter() - start)
                    for c in caches[use]:
                        c.trim(n)
            t = Timing(ctx, n, statistics.median(times[None]) * 1e3, statistics.median(times[stack]) * 1e3)
            print(f"context {ctx}, {n} token(s): eager {t.eager_ms:.1f} ms, compiled {t.compiled_ms:.1f} ms, "
                  f"{t.speedup:.2f}x", flush=True)
            out.append(t)
    model.compiled = stack
    return out


def rows_are_invariant(model) -> bool:
    """7 tokens across the 256-key boundary in one pass, then one at a time: the same bits."""
    tokens, context = [11, 22, 33, 44, 55, 66, 77], torch.tensor([[100 + i for i in range(252)]])
    with torch.inference_mode():
        one, many = model.make_cache(), model.make_cache()
        model(context, one)
        model(context, many)
        together = model(torch.tensor([tokens]), many)
        alone = torch.cat([model(torch.tensor([[t]]), one) for t in tokens], dim=1)
    return torch.equal(together, alone)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--out")
    args = ap.parse_args()
    model = loading.load("default", "quantized", backend="torch:cpu").model
    compile_s = None
    if model.compiled is None:
        start = time.perf_counter()
        compiled.compile_to(model, loading.compiled_folder(), print)
        compile_s = time.perf_counter() - start
    start = time.perf_counter()
    stack = compiled.load_from(model, loading.compiled_folder())
    load_s = time.perf_counter() - start
    model.compiled = stack
    invariant = rows_are_invariant(model)
    print(f"loaded in {load_s:.2f} s; compiled verify rows bitwise the compiled one-token passes: {invariant}")
    timings = time_passes(model, stack, args.reps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"compile_s": compile_s, "load_s": load_s, "rows_invariant": invariant,
                       "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "timings": [asdict(t) | {"speedup": t.speedup} for t in timings]}, f, indent=1)


if __name__ == "__main__":
    main()
