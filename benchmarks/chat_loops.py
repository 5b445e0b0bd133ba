"""How often the default model loops on 20 everyday questions at each candidate sampling setting
(``mlxspec.measure.loops``): the measurement behind the chat's defaults.

    .venv/bin/python benchmarks/chat_loops.py [--max-tokens 128] [--seed 0] [--show] [--only 0,2]

Prints one markdown row per setting, out of 20: replies that loop (repeat a run of 8 tokens 3+
times and run to --max-tokens), that repeat, that ran to --max-tokens; mean reply length;
seconds. ``--show`` prints each reply.
"""

# ruff: noqa: I001
from __future__ import annotations

import argparse
import time

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx)
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.loops import measure_loops
from mlxspec.session import Session

# (temperature, top_p, top_k, min_p): greedy (the chat's old default), the model card's usage
# example (T=0.2, top-p 0.9), and common chat settings around it.
CANDIDATES: tuple[tuple[float, float, int, float], ...] = (
    (0.0, 1.0, 0, 0.0),
    (0.2, 0.9, 0, 0.0),
    (0.5, 0.9, 0, 0.0),
    (0.7, 0.9, 0, 0.0),
    (0.7, 1.0, 0, 0.1),
    (1.0, 1.0, 0, 0.1),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--only", default=None, help="the candidates to run, by index into CANDIDATES (e.g. 5,4)")
    a = ap.parse_args()
    picked = CANDIDATES if a.only is None else [CANDIDATES[int(i)] for i in a.only.split(",")]
    from mlxspec.targets import loading

    session = Session(loading.load("default"), "none", log=None)
    print("| T | top-p | top-k | min-p | loops /20 | repeats | ran to max | mean tokens | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t, p, k, m in picked:
        t0 = time.perf_counter()
        r = measure_loops(session, SamplingParams(t, p, k, m), a.max_tokens, a.seed)
        print(f"| {t:g} | {p:g} | {k} | {m:g} | {r.looped} | {r.repeated} | {r.at_limit} | {r.mean_tokens:.0f} | "
              f"{time.perf_counter() - t0:.0f} |", flush=True)
        if a.show:
            tok = session.lm.tokenizer
            for rep in r.replies:
                mark = "LOOP" if rep.loops else rep.stop_reason + (" repeats" if rep.repeats else "")
                print(f"  [{mark}] {rep.question} -> {tok.decode(rep.tokens)!r}", flush=True)


if __name__ == "__main__":
    main()
