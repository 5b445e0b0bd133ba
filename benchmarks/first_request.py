"""Is the first speculative request of a session slower to start than the later ones?

Opens one session on the default model and its default drafter (``--k auto``), then, on each
held-out prompt in turn, times target-only decoding and speculative decoding, the very first
speculative request of the session included, and reports each run's prefill (from the call to
the first committed tokens) and the gap between the first speculative request's prefill and
target-only's on the same prompt (issue 37's goal: within 0.2 s).

    python benchmarks/first_request.py [--prompts benchmarks/prompts/heldout-8.jsonl] [-n 32] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.runs import collect_run
from mlxspec.core.sampling import SamplingParams
from mlxspec.cpuload import CpuMeter
from mlxspec.measure.runs import read_prompts_file
from mlxspec.session import Session, SessionOptions


@dataclass(frozen=True)
class Timed:
    prompt: str
    method: str
    order: int  # the how-many-th speculative request of the session (0 for target-only)
    prefill_s: float  # from the request (the ``stream`` call) to its first committed tokens, as a user waits
    engine_prefill_s: float  # the engine's own prefill_s: from its first instruction
    total_s: float
    tokens: int


def timed(session: Session, prompt: str, method: str, order: int, ids: list[int], max_tokens: int) -> Timed:
    t0 = time.perf_counter()
    events = session.stream(ids, SamplingParams(), max_tokens)
    first = None

    def marked():
        nonlocal first
        for ev in events:
            first = first or time.perf_counter()
            yield ev

    run = collect_run(marked())
    return Timed(prompt, method, order, (first or time.perf_counter()) - t0, run.prefill_s,
                 time.perf_counter() - t0, len(run.tokens))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "prompts" / "heldout-8.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=32)
    ap.add_argument("--draft", default="default")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    items = read_prompts_file(a.prompts)
    meter = CpuMeter()
    t0 = time.perf_counter()
    session = Session.open(SessionOptions("default", "auto", "auto", a.draft, None))
    a.draft = session.drafter.name if session.drafter is not None else "none"
    ready_s = time.perf_counter() - t0
    runs: list[Timed] = []
    for n, it in enumerate(items, 1):
        ids = session.encode(it["text"])
        runs.append(timed(session.use("none"), it["id"], "target-only", 0, ids, a.max_tokens))
        runs.append(timed(session.use(a.draft), it["id"], "speculative", n, ids, a.max_tokens))
    first_spec = runs[1]
    gap = first_spec.prefill_s - runs[0].prefill_s
    later = [s.prefill_s - t.prefill_s for t, s in zip(runs[2::2], runs[3::2])]
    out = {"ready_s": ready_s, "others_busy": meter.others_busy(), "first_request_gap_s": gap,
           "later_gaps_s_median": statistics.median(later) if later else None, "runs": [asdict(r) for r in runs]}
    print(f"session ready in {ready_s:.1f} s; first speculative request's prefill {first_spec.prefill_s:.3f} s vs "
          f"target-only {runs[0].prefill_s:.3f} s: gap {gap:+.3f} s (goal < 0.2); later requests' median gap "
          f"{out['later_gaps_s_median']:+.3f} s; others kept {out['others_busy']:.0%} of the CPUs busy")
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
