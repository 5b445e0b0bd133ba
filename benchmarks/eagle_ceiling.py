"""How fast could any K policy make greedy decoding with this eagle head? An upper bound that
separates the head's acceptance from the engine's choices.

The target decodes each Spec-Bench prompt greedily; the head then runs its K-step unroll over
that text teacher-forced (``training.eagle_train.unroll``: what drafting from each slot would
have produced, in one pass), giving for every slot the chain of drafts it would have accepted and
its confidence (max q) at each. A step that starts at slot s with K drafts commits 1 + (leading
accepted drafts) tokens and costs c(K + 1) + K d target-pass units, c being the verify-cost
curve (one pass over L tokens / one token) and d the head's cost per drafted token, timed here
against the target's one-token pass. Policies walk the text as the engine would:

* fixed K = 0..8 (K = 0 is target-only decoding: 1.00 by construction);
* confidence-gated: draft while the calibrated acceptance of the next draft (binned max q,
  fitted on the other prompts) raises expected tokens per unit of time, every step paying
  for the drafts it computed;
* oracle: K = exactly the drafts that will be accepted (no policy can beat it).

    python benchmarks/eagle_ceiling.py [--draft smollm2-135m-eagle] [--per-category 2] [--tokens 96]
        [--cost 1,1.13,1.21,1.35,1.49,1.47] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import mlxspec  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import numpy as np

from mlxspec.core.autok import extend_curve
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.runs import spec_bench_prompts
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load
from mlxspec.targets.tokenizer import encode_prompt
from mlxspec.training.eagle_train import unroll

MAX_K = 8
BINS = 10


@dataclass
class Slot:
    """Drafting from one slot: which drafts the target would accept, and the head's max q."""

    prompt: int
    accepted: list[bool]
    confidence: list[float]


@dataclass
class PolicyResult:
    policy: str
    speedup: float  # tokens per unit of time over target-only decoding's
    tokens_per_step: float


def greedy_text(lm, ids: list[int], tokens: int) -> list[int]:
    out = []
    for ev in generate(lm.model, ids, SamplingParams(), tokens, set(), lm.context_length):
        if isinstance(ev, Step):
            out += [t.id for t in ev.tokens if t.emitted]
    return out


def slots_of(lm, head, ids: list[int], answer: list[int], prompt: int) -> list[Slot]:
    """Slot s reads the target's feature at s and token s+1; its j-th draft is the head's j-step
    prediction at slot s+j-1, judged against the target's argmax there."""
    seq = ids + answer
    logits, hidden = lm.model(mx.array(seq)[None], None, return_hidden=True)
    best = np.array(mx.argmax(logits[0], axis=-1))[1:]
    agree, conf = [], []
    for pred in unroll(head, hidden[:, :-1].astype(head.fc.weight.dtype), mx.array(seq[1:])[None], MAX_K):
        z = head.lm_head(pred)[0].astype(mx.float32)
        agree.append(np.array(head.vocab_ids[mx.argmax(z, axis=-1)]) == best)
        conf.append(np.array(mx.softmax(z, axis=-1).max(axis=-1)))
    last = len(seq) - 2  # the last slot whose first draft has a target argmax to meet
    out = []
    for s in range(len(ids) - 2, last):
        n = min(MAX_K, last - s)
        out.append(Slot(prompt, [bool(agree[j][s + j]) for j in range(n)], [float(conf[j][s + j]) for j in range(n)]))
    return out


def draft_cost(lm, head, ids: list[int], rounds: int = 30) -> float:
    """The head's one-token step over the target's one-token pass, medians of alternating runs."""
    cache, hcache = lm.model.make_cache(), head.make_cache()
    _, hidden = lm.model(mx.array(ids)[None], cache, return_hidden=True)
    head(hidden[:, :-1], mx.array(ids[1:])[None], hcache)
    f, tok = hidden[:, -1:], mx.array([[ids[-1]]])
    target_ms, head_ms = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        mx.eval(lm.model(tok, cache))
        t1 = time.perf_counter()
        mx.eval(head(f, tok, hcache))
        t2 = time.perf_counter()
        for c in (*cache, *hcache):
            c.trim(1)
        target_ms.append(t1 - t0)
        head_ms.append(t2 - t1)
    return statistics.median(head_ms) / statistics.median(target_ms)


def walk(policy: str, slots: list[Slot], choose: Callable[[Slot], tuple[int, int]], cost: Sequence[float],
         d: float) -> PolicyResult:
    """Decode along the text: at each step ``choose`` gives (K verified, drafts computed). A step
    never runs past its prompt: the next one starts at the next prompt's first slot."""
    tokens = time_units = steps = 0.0
    i = 0
    while i < len(slots):
        s = slots[i]
        k, computed = choose(s)
        k = min(k, len(s.accepted))
        n = next((j for j in range(k) if not s.accepted[j]), k)
        tokens += n + 1
        time_units += cost[k] + computed * d
        steps += 1
        step_end = i + n + 1
        if step_end < len(slots) and slots[step_end].prompt != s.prompt:
            step_end = next((j for j in range(i + 1, len(slots)) if slots[j].prompt != s.prompt), len(slots))
        i = step_end
    return PolicyResult(policy, tokens / time_units, tokens / steps)


def calibration(slots: list[Slot]) -> np.ndarray:
    """P(draft accepted | its max q in bin b, the drafts before it accepted), smoothed."""
    hits, seen = np.full(BINS, 0.3), np.ones(BINS)
    for s in slots:
        for a, c in zip(s.accepted, s.confidence):
            b = min(int(c * BINS), BINS - 1)
            hits[b] += a
            seen[b] += 1
            if not a:
                break
    return hits / seen


def gated(cal: np.ndarray, cost: Sequence[float], d: float) -> Callable[[Slot], tuple[int, int]]:
    """Draft one more while it raises expected tokens per unit of time."""

    def choose(s: Slot) -> tuple[int, int]:
        survive, expect, k = 1.0, 1.0, 0
        rate = 1.0 / cost[0]
        for j, c in enumerate(s.confidence):
            nxt_survive = survive * cal[min(int(c * BINS), BINS - 1)]
            nxt = (expect + nxt_survive) / (cost[j + 1] + (j + 1) * d)
            if nxt <= rate:
                return k, j + 1
            survive, expect, k, rate = nxt_survive, expect + nxt_survive, j + 1, nxt
        return k, k

    return choose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default="smollm2-135m-eagle")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--cost", default="1,1.13,1.21,1.35,1.49,1.47",
                    help="one target pass over L = 1, 2, ... tokens, in one-token passes "
                         "(BENCHMARKS.md, what verifying L tokens costs on MLX)")
    ap.add_argument("--out")
    args = ap.parse_args()
    cost = extend_curve([float(x) for x in args.cost.split(",")], MAX_K + 1)
    cost = [c / cost[0] for c in cost]
    lm = load("default")
    head = make_drafter(args.draft, lm).head
    items = spec_bench_prompts(per_category=args.per_category)[0]
    slots: list[Slot] = []
    for i, p in enumerate(items):
        ids = encode_prompt(lm.tokenizer, p["text"])
        slots += slots_of(lm, head, ids, greedy_text(lm, ids, args.tokens), i)
        print(f"{p['category']:16s} #{p['id']}: first-draft agreement "
              f"{np.mean([s.accepted[0] for s in slots if s.prompt == i]):.2f}", flush=True)
    d = draft_cost(lm, head, encode_prompt(lm.tokenizer, items[0]["text"]))
    results = [walk(f"K={k}", slots, lambda s, k=k: (k, k), cost, d) for k in range(MAX_K + 1)]
    # cross-fitted: each prompt's calibration comes from the other prompts
    by_prompt = {}
    for i in range(len(items)):
        cal = calibration([s for s in slots if s.prompt != i])
        by_prompt[i] = gated(cal, cost, d)
    results.append(walk("confidence-gated", slots, lambda s: by_prompt[s.prompt](s), cost, d))
    oracle = lambda s: (next((j for j, a in enumerate(s.accepted) if not a), len(s.accepted)),) * 2  # noqa: E731
    results.append(walk("oracle", slots, oracle, cost, d))
    print(f"\nslots {len(slots)}, draft cost d = {d:.3f} target passes per drafted token, cost curve "
          + " ".join(f"{c:.2f}" for c in cost[:6]))
    for r in results:
        print(f"{r.policy:18s} {r.speedup:.3f}x  tokens/step {r.tokens_per_step:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"draft": args.draft, "tokens": args.tokens, "per_category": args.per_category,
                       "draft_cost": d, "cost_curve": cost, "calibration_all": calibration(slots).tolist(),
                       "results": [asdict(r) for r in results]}, f, indent=2)


if __name__ == "__main__":
    main()
