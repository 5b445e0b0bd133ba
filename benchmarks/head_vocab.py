"""How much of the target's next-token distribution can an eagle head propose at all? A head
drafts only over its reduced vocabulary (q = 0 elsewhere), so the mass p puts outside it is
acceptance no training can reach: rejection sampling keeps a draft with sum min(p, q), at most
p's mass inside the vocabulary, and a greedy draft can only match an argmax inside it.

On eval-draft's held-out prompts (``--per-category`` per Spec-Bench category), the target writes
each answer (greedy, and sampled at T = 1 from seed 0); the text is teacher-forced through the
target once, and at every answer position this records, for each head in ``--draft``:
- ``mass``: p's mass inside the head's vocabulary at T = 1, and after the chat's min-p 0.1;
- ``argmax``: how often the target's argmax is inside it (on the greedy text);
- ``context``: p's mass (T = 1) on tokens outside it that the prompt or the answer so far already
  holds, what a head whose rows also took in the context's tokens could reach beyond it.
Means over positions, per category and for all prompts.

    python benchmarks/head_vocab.py [--draft smollm2-135m-eagle --draft FOLDER ...] [--per-category 4]
        [-n 96] [--out benchmarks/results/head-vocab.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
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

MIN_P = 0.1


@dataclass
class Coverage:
    head: str
    vocab: int
    category: str
    positions: int
    mass_t1: float  # p's mass inside the vocabulary, T = 1, on the sampled text
    mass_chat: float  # the same after min-p 0.1 (the chat's sampling), on the sampled text
    argmax: float  # the target's argmax inside the vocabulary, on the greedy text
    context: float  # mass at T = 1 outside the vocabulary on tokens already in the context


def answer(lm, ids: list[int], params: SamplingParams, tokens: int) -> list[int]:
    out = []
    for ev in generate(lm.model, ids, params, tokens, set(), lm.context_length, seed=0):
        if isinstance(ev, Step):
            out += [t.id for t in ev.tokens if t.emitted]
    return out


def next_token_probs(lm, ids: list[int], text: list[int]) -> mx.array:
    """p at T = 1 for every answer token, given everything before it: (len(text), V)."""
    logits = lm.model(mx.array(ids + text)[None], None)[0, len(ids) - 1 : -1].astype(mx.float32)
    return mx.softmax(logits, axis=-1)


def seen_before(ids: list[int], text: list[int], vocab_size: int) -> mx.array:
    """(len(text), V): True where a token occurs in the prompt or the answer before that position."""
    seq = ids + text
    first = [len(seq)] * vocab_size
    for i in reversed(range(len(seq))):
        first[seq[i]] = i
    return mx.array(first)[None, :] < (len(ids) + mx.arange(len(text)))[:, None]


def chat_filtered(p: mx.array) -> mx.array:
    kept = mx.where(p >= MIN_P * p.max(axis=-1, keepdims=True), p, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", action="append", help="eagle heads (registry names or folders); repeatable")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--out")
    args = ap.parse_args()
    lm = load("default")
    heads = {name: make_drafter(name, lm).head.vocab_ids for name in args.draft or ["smollm2-135m-eagle"]}
    # (head, category) -> [sampled positions, mass at T = 1, at the chat's, greedy positions, argmax inside, context]
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 6)
    for p in spec_bench_prompts(per_category=args.per_category)[0]:
        ids = encode_prompt(lm.tokenizer, p["text"])
        text = answer(lm, ids, SamplingParams(temperature=1.0), args.max_tokens)
        sampled = next_token_probs(lm, ids, text)
        seen = seen_before(ids, text, sampled.shape[-1])
        chat = chat_filtered(sampled)
        greedy = next_token_probs(lm, ids, answer(lm, ids, SamplingParams(), args.max_tokens)).argmax(axis=-1)
        for name, vocab in heads.items():
            inside = mx.zeros(sampled.shape[-1]).at[vocab].add(1.0) > 0
            values = (sampled.shape[0], sampled[:, vocab].sum().item(), chat[:, vocab].sum().item(),
                      greedy.size, inside[greedy].sum().item(), (sampled * (seen & ~inside)).sum().item())
            for cat in (p["category"], "all"):
                sums[(name, cat)] = [a + b for a, b in zip(sums[(name, cat)], values)]
        print(p["category"], {n: round(sums[(n, p["category"])][1] / sums[(n, p["category"])][0], 3) for n in heads},
              flush=True)
    rows = [Coverage(name, int(heads[name].size), cat, int(s[0]), round(s[1] / s[0], 4), round(s[2] / s[0], 4),
                     round(s[4] / s[3], 4), round(s[5] / s[0], 4)) for (name, cat), s in sums.items()]
    for r in rows:
        if r.category == "all":
            print(f"{r.head} ({r.vocab} tokens): mass T = 1 {r.mass_t1:.3f}, the chat's {r.mass_chat:.3f}, "
                  f"argmax {r.argmax:.3f}; outside it, in the context {r.context:.3f} ({r.positions} positions)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"per_category": args.per_category, "max_tokens": args.max_tokens,
                       "rows": [asdict(r) for r in rows]}, f, indent=2)


if __name__ == "__main__":
    main()
