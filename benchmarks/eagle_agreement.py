"""Is an eagle head's acceptance in the engine what its training measures? The first prompt of
each Spec-Bench category (bench's prompt set): greedy decoding with the head at K=1 (first-draft acceptance as the engine
sees it), then the same text teacher-forced through the target and the head in one pass each
(how often the head's argmax equals the target's, the quantity training optimises). A gap
between the two would be a train/inference mismatch (features misaligned, a cache bug); equal
numbers put the problem in what the head has learned.

    python benchmarks/eagle_agreement.py [--draft smollm2-135m-eagle] [--tokens 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import mlxspec  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx

from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.runs import spec_bench_prompts
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load
from mlxspec.targets.tokenizer import encode_prompt


@dataclass
class Agreement:
    category: str
    positions: int
    engine_first_draft: float  # accepted / steps at K=1
    teacher_forced: float  # head argmax == target argmax on the same text


def engine_run(lm, drafter, ids: list[int], tokens: int) -> tuple[list[int], float]:
    out, accepted, steps = [], 0, 0
    for ev in generate(lm.model, ids, SamplingParams(), tokens, set(), lm.context_length, drafter=drafter, k=1):
        if isinstance(ev, Step):
            steps, accepted = steps + 1, accepted + ev.accepted
            out += [t.id for t in ev.tokens if t.emitted]
    return out, accepted / max(steps, 1)


def teacher_forced(lm, head, ids: list[int], answer: list[int]) -> mx.array:
    """1.0 where the head, reading the target's real feature at slot s and token x_{s+1},
    predicts the target's argmax for x_{s+2}, over the answer's positions."""
    seq = ids + answer
    logits, hidden = lm.model(mx.array(seq)[None], None, return_hidden=True)
    target_next = mx.argmax(logits[0], axis=-1)
    _, z = head(hidden[:, :-1].astype(head.fc.weight.dtype), mx.array(seq[1:])[None])
    guess = head.vocab_ids[mx.argmax(z[0], axis=-1)]
    c = len(ids)
    return (guess[c - 2:] == target_next[c - 1:]).astype(mx.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default="smollm2-135m-eagle")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out")
    args = ap.parse_args()
    lm = load("default")
    drafter = make_drafter(args.draft, lm)
    rows = []
    for p in spec_bench_prompts(per_category=1)[0]:
        ids = encode_prompt(lm.tokenizer, p["text"])
        answer, engine = engine_run(lm, drafter, ids, args.tokens)
        ok = teacher_forced(lm, drafter.head, ids, answer)
        rows.append(Agreement(p["category"], ok.size, engine, ok.mean().item()))
        print(f"{rows[-1].category:16s} engine {engine:.2f}  teacher-forced {rows[-1].teacher_forced:.2f}", flush=True)
    n = sum(r.positions for r in rows)
    total = {"engine_first_draft": sum(r.engine_first_draft * r.positions for r in rows) / n,
             "teacher_forced": sum(r.teacher_forced * r.positions for r in rows) / n}
    print(f"{'all':16s} engine {total['engine_first_draft']:.2f}  teacher-forced {total['teacher_forced']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"draft": args.draft, "tokens": args.tokens, "all": total, "rows": [asdict(r) for r in rows]}, f, indent=2)


if __name__ == "__main__":
    main()
