"""Why are the eagle head's drafts refused? Five tables on held-out prompts, all computed from one
cached greedy run and teacher-forced passes over it.

The held-out set is eval-draft's and bench's: the first ``--per-category`` Spec-Bench questions of
each category (draft training removes every Spec-Bench turn, ``training.distill``). The target
decodes each greedily with the head drafting one token per step (K = 1 greedy output is the
target's own, token for token), which gives the text and the engine's first-draft acceptance at
every step in one run; both are cached in ``--cache``. Then one torch pass per prompt over
prompt + output keeps every layer's hidden state and gives, at each output position t (the
drafted token's index in the sequence):

1. the head's first-draft acceptance teacher-forced (real target features at every slot, as in
   training and ``eagle_agreement.py``), by the draft's absolute position and by prompt length,
   next to the engine's; and the same with the head's attention cut to the last 160 slots (the
   window it trained on: rope makes attention depend only on distance, so this isolates "longer
   contexts than training" from "later positions");
2. whether the target's greedy token is inside the head's vocabulary (outside it q = 0);
3. the teacher-forced figure next to the engine's on the same steps, and, after a hit, the next
   draft's hit rate with the target's real feature vs the head's own prediction of it (as
   drafting runs); the head's top-4 recall;
4. ``self:L`` first-draft acceptance (argmax of norm + head over layer L's hidden state vs the
   full target's) for L in ``--layers``, and the target's n-gram continuations: for n = 1..4,
   whether the last n tokens occurred earlier in prompt + output, and whether the token after
   their most recent earlier occurrence is the target's next greedy token; and lookup combined
   with the head (lookup's continuation where it has one, else the head's; either right);
5. acceptance against distinct training prompts is not measured here (see the dated note).

    python benchmarks/refusals.py [--draft smollm2-135m-eagle] [--per-category 4] [--tokens 128]
        [--layers 20,25,28] [--cache benchmarks/results/refusals-greedy.json]
        [--out benchmarks/results/refusals.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable, Sequence
from itertools import pairwise
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
import numpy as np
import torch

from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.runs import run_header, spec_bench_prompts
from mlxspec.session import Session
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load
from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids
from mlxspec.torchpath.model import pass_inputs
from mlxspec.training.torch_train import unroll

EDGES = (160, 320, 640)  # absolute-position buckets: the head trained on windows of 160 slots
WINDOW = 160
TOP_K = 4
CASCADE_NS = (2, 3)  # prompt lookup with these context lengths, combined with the head
NGRAM_NS = (1, 2, 3, 4)


# ----------------------------------------------------------------------------- pure parts


def bucket_label(x: int, edges: Sequence[int] = EDGES) -> str:
    """"lo-hi" (inclusive) of the bucket ``x`` falls in, "lo+" for the last one."""
    lo = 0
    for e in edges:
        if x < e:
            return f"{lo}-{e - 1}"
        lo = e
    return f"{lo}+"


def bucket_labels(edges: Sequence[int] = EDGES) -> list[str]:
    return [bucket_label(lo, edges) for lo in (0, *edges)]


@dataclass(frozen=True)
class Rate:
    """A share over ``n`` trials (None for none)."""

    bucket: str
    n: int
    rate: float | None


def rates_by_bucket(pairs: Iterable[tuple[int, bool]], edges: Sequence[int] = EDGES) -> list[Rate]:
    """(key, hit) pairs -> the hit rate in every bucket of ``edges``, empty buckets included."""
    hits: dict[str, list[int]] = {b: [] for b in bucket_labels(edges)}
    for key, hit in pairs:
        hits[bucket_label(key, edges)].append(int(hit))
    return [Rate(b, len(v), sum(v) / len(v) if v else None) for b, v in hits.items()]


def ngram_continuations(seq: Sequence[int], start: int, n: int) -> list[tuple[bool, bool]]:
    """For every t in [start, len(seq)): (the n tokens before t occurred earlier, ending before
    t - 1; the token that followed their most recent such occurrence is seq[t]). Prompt lookup
    with exactly n tokens of context, judged against the text itself."""
    follower: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
    out = []
    for t in range(len(seq)):
        key = tuple(seq[t - n:t]) if t >= n else None  # the first n tokens have no n tokens of context
        if t >= start:
            j = None if key is None else follower.get(key)
            out.append((j is not None, j is not None and seq[j] == seq[t]))
        if key is not None:
            follower[key] = t
    return out


def band_mask(length: int, window: int) -> np.ndarray:
    """(length, length) bool: row r attends columns r - window + 1 .. r."""
    r = np.arange(length)
    d = r[:, None] - r[None, :]
    return (d >= 0) & (d < window)


def step_positions(prompt_len: int, steps: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Engine steps (drafted, accepted, emitted) -> (index in the sequence of the step's first
    draft, accepted) for the steps that drafted."""
    out, pos = [], prompt_len
    for k, accepted, emitted in steps:
        if k > 0:
            out.append((pos, accepted))
        pos += emitted
    return out


def share(xs: Sequence[bool]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ----------------------------------------------------------------------------- records


@dataclass
class Sample:
    """One held-out prompt's greedy run (the cache): ids, the output, the engine's steps."""

    id: int | str
    category: str
    prompt: list[int]
    output: list[int]
    steps: list[tuple[int, int, int]]  # (drafted, accepted, emitted) per engine step, K = 1


@dataclass
class Slot:
    """One output position t of one prompt: the drafted token's index, and which predictors
    agree with the target's greedy token there."""

    prompt: int
    category: str
    prompt_len: int
    pos: int
    in_vocab: bool
    head: bool  # teacher-forced, full context
    head_top: bool  # the target's token is among the head's TOP_K best (what a tree could still catch)
    head_step2: bool  # a second draft here: the head reads its own predicted feature for slot t - 2
    head_window: bool  # teacher-forced, attention cut to the last WINDOW slots
    self_layers: dict[int, bool]
    engine: bool | None  # the engine's first draft, where a step started here
    ngram: dict[int, tuple[bool, bool]] = field(default_factory=dict)  # n -> (matched, correct)


@dataclass(frozen=True)
class PositionRow:
    """Table 1: first-draft acceptance in one bucket (of absolute position or prompt length)."""

    bucket: str
    positions: int
    engine_steps: int
    engine: float | None
    teacher_forced: float | None
    teacher_forced_window: float | None
    in_vocab: float | None


@dataclass(frozen=True)
class CategoryRow:
    """Tables 2-4 per Spec-Bench category (and "all")."""

    category: str
    positions: int
    engine_steps: int
    engine: float | None
    teacher_forced_at_engine_steps: float | None
    teacher_forced: float | None
    teacher_forced_window: float | None
    in_vocab: float | None
    head_given_in_vocab: float | None
    head_top: float | None  # the target's token in the head's top TOP_K
    head_after_hit: float | None  # teacher-forced hit at t + 1 given a hit at t (real features at both)
    head_step2_after_hit: float | None  # the same with the head's own predicted feature, as drafting runs
    self_layers: dict[str, float | None]
    lookup_else_head: dict[str, float | None]  # ngram:n's continuation where it has one, else the head's
    head_or_lookup: dict[str, float | None]  # either is right (a two-candidate tree)


@dataclass(frozen=True)
class NgramRow:
    n: int
    positions: int
    matched: float  # an earlier occurrence of the last n tokens exists
    correct: float  # its continuation is the target's next greedy token
    correct_given_match: float | None


@dataclass
class Report:
    header: dict
    command: str
    draft: str
    per_category: int
    tokens: int
    layers: list[int]
    load_average_start: list[float]
    load_average_end: list[float]
    seconds: dict[str, float]
    greedy_check: float  # share of output tokens equal to the teacher-forced target argmax
    by_position: list[PositionRow] = field(default_factory=list)
    by_prompt_length: list[PositionRow] = field(default_factory=list)
    by_category: list[CategoryRow] = field(default_factory=list)
    ngram: list[NgramRow] = field(default_factory=list)
    ngram_by_category: dict[str, list[NgramRow]] = field(default_factory=dict)


def position_rows(slots: Sequence[Slot], key) -> list[PositionRow]:
    rows = []
    for label in bucket_labels():
        s = [x for x in slots if bucket_label(key(x)) == label]
        e = [x.engine for x in s if x.engine is not None]
        rows.append(PositionRow(label, len(s), len(e), share(e), share([x.head for x in s]),
                                share([x.head_window for x in s]), share([x.in_vocab for x in s])))
    return rows


def after_hits(slots: Sequence[Slot], second: str = "head") -> list[bool]:
    """Wherever the head hit at t (first draft), whether ``second`` hit at t + 1 in the same
    prompt: "head" reads the target's real feature there, "head_step2" its own prediction."""
    return [getattr(b, second) for a, b in pairwise(slots)
            if a.head and b.prompt == a.prompt and b.pos == a.pos + 1]


def category_row(name: str, s: Sequence[Slot], layers: Sequence[int]) -> CategoryRow:
    e = [x for x in s if x.engine is not None]
    inv = [x for x in s if x.in_vocab]
    return CategoryRow(name, len(s), len(e), share([x.engine for x in e]), share([x.head for x in e]),
                       share([x.head for x in s]), share([x.head_window for x in s]), share([x.in_vocab for x in s]),
                       share([x.head for x in inv]), share([x.head_top for x in s]), share(after_hits(s)),
                       share(after_hits(s, "head_step2")),
                       {f"self:{L}": share([x.self_layers[L] for x in s]) for L in layers},
                       {f"ngram:{n}": share([x.ngram[n][1] if x.ngram[n][0] else x.head for x in s]) for n in CASCADE_NS},
                       {f"ngram:{n}": share([x.ngram[n][1] or x.head for x in s]) for n in CASCADE_NS})


def ngram_rows(samples: Sequence[Sample]) -> list[NgramRow]:
    rows = []
    for n in NGRAM_NS:
        pairs = [p for smp in samples for p in ngram_continuations(smp.prompt + smp.output, len(smp.prompt), n)]
        m = [a for a, _ in pairs]
        c = [b for _, b in pairs]
        rows.append(NgramRow(n, len(pairs), share(m) or 0.0, share(c) or 0.0,
                             share([b for a, b in pairs if a])))
    return rows


# ----------------------------------------------------------------------------- model work


def greedy_samples(lm, drafter, items, tokens: int) -> list[Sample]:
    """Each prompt decoded greedily with the head at K = 1: the target's text and every step."""
    stop = stop_token_ids(lm.tokenizer)
    session = Session(lm, drafter, 1, None, log=None)
    out = []
    for it in items:
        ids = encode_prompt(lm.tokenizer, it["text"])
        text, steps = [], []
        for ev in session.stream(ids, SamplingParams(), tokens, 0, stop_ids=stop):
            if isinstance(ev, Step):
                steps.append((ev.k, ev.accepted, len(ev.emitted)))
                text += ev.emitted
        out.append(Sample(it["id"], it["category"], ids, text, steps))
        print(f"  {it['category']:15s} #{it['id']}: {len(ids)} prompt + {len(text)} tokens, engine first draft "
              f"{share([a > 0 for k, a, _ in steps if k > 0]) or 0:.2f}", flush=True)
    return out


def teacher_forced(model, head, seq: list[int], layers: Sequence[int], start: int = 0) -> dict[str, np.ndarray]:
    """One pass over ``seq`` keeping every layer: the full target's argmax at every index from
    ``start`` on (-1 before it: the vocabulary-wide heads are most of a pass's cost), the
    argmax of norm + head after each of ``layers`` likewise, and the head's guess for index i + 2 from
    slot i (real features): its argmax and ``TOP_K`` best with full attention, its argmax with
    attention cut to ``WINDOW`` slots."""
    with torch.inference_mode():
        tok = torch.tensor([seq], dtype=torch.long)
        h = model.model.embed_tokens(tok)
        mask, positions = pass_inputs(len(seq), 0, None, None, h.device)
        cos, sin = model.rope.tables(positions, h.dtype)
        out = {}

        def argmax_from_start(normed: torch.Tensor) -> np.ndarray:
            best = np.full(len(seq), -1, np.int64)
            best[start:] = model.head(normed[:, start:]).argmax(-1)[0].numpy()
            return best

        for i, layer in enumerate(model.layers, 1):
            h = layer(h, mask, None, model.rope, cos, sin)
            if i in layers:
                out[f"self:{i}"] = argmax_from_start(model.model.norm(h))
        feat = model.model.norm(h)
        out["target"] = argmax_from_start(feat)
        f, nxt = feat[:, :-1], tok[:, 1:]
        _, z = head(f, nxt)
        out["head"] = head.vocab_ids[z.argmax(-1)[0]].numpy()
        out["head_top"] = head.vocab_ids[z.topk(TOP_K, dim=-1).indices[0]].numpy()
        step2 = unroll(head, f, nxt, 2)[1]  # slot i reads the head's own prediction of f_i
        out["head_step2"] = head.vocab_ids[head.lm_head(step2).argmax(-1)[0]].numpy()
        _, zw = head(f, nxt, mask=band_mask(len(seq) - 1, WINDOW))
        out["head_window"] = head.vocab_ids[zw.argmax(-1)[0]].numpy()
        return out


def slots_of(i: int, smp: Sample, tf: dict[str, np.ndarray], vocab: set[int], layers: Sequence[int]) -> list[Slot]:
    """Output positions t = c .. c + len(output) - 1 (c the prompt length): the target's greedy
    token there is its argmax at t - 1; the head's guess for it comes from slot t - 2."""
    c = len(smp.prompt)
    engine = dict(step_positions(c, smp.steps))
    lookup = {n: ngram_continuations(smp.prompt + smp.output, c, n) for n in CASCADE_NS}
    out = []
    for t in range(c, c + len(smp.output)):
        y = int(tf["target"][t - 1])
        out.append(Slot(i, smp.category, c, t, y in vocab, int(tf["head"][t - 2]) == y, y in tf["head_top"][t - 2],
                        int(tf["head_step2"][t - 2]) == y, int(tf["head_window"][t - 2]) == y,
                        {L: int(tf[f"self:{L}"][t - 1]) == y for L in layers},
                        None if t not in engine else engine[t] > 0, {n: lookup[n][t - c] for n in CASCADE_NS}))
    return out


def load_cache(path: Path, items, tokens: int, draft: str) -> list[Sample] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("tokens") != tokens or data.get("draft") != draft or [s["id"] for s in data["samples"]] != [
            it["id"] for it in items]:
        return None
    return [Sample(s["id"], s["category"], s["prompt"], s["output"], [tuple(x) for x in s["steps"]])
            for s in data["samples"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default="smollm2-135m-eagle")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", default="20,25,28")
    ap.add_argument("--cache", default="benchmarks/results/refusals-greedy.json")
    ap.add_argument("--out", default="benchmarks/results/refusals.json")
    args = ap.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    load_start = list(os.getloadavg())
    t0 = time.perf_counter()
    lm = load("default", backend="torch:cpu")
    drafter = make_drafter(args.draft, lm)
    head = drafter.head
    items = spec_bench_prompts(per_category=args.per_category)[0]
    cache = Path(args.cache)
    samples = load_cache(cache, items, args.tokens, args.draft)
    t1 = time.perf_counter()
    if samples is None:
        print(f"greedy runs, K = 1 with {args.draft} ({len(items)} prompts x {args.tokens} tokens):", flush=True)
        samples = greedy_samples(lm, drafter, items, args.tokens)
        cache.write_text(json.dumps({"draft": args.draft, "tokens": args.tokens,
                                     "samples": [asdict(s) for s in samples]}))
    t2 = time.perf_counter()
    vocab = {int(v) for v in head.vocab_ids.tolist()}
    slots: list[Slot] = []
    agree = total = 0
    for i, smp in enumerate(samples):
        seq = smp.prompt + smp.output
        tf = teacher_forced(lm.model, head, seq, layers, start=len(smp.prompt) - 1)
        c = len(smp.prompt)
        agree += int(sum(int(tf["target"][t - 1]) == seq[t] for t in range(c, len(seq))))
        total += len(smp.output)
        slots += slots_of(i, smp, tf, vocab, layers)
    t3 = time.perf_counter()
    cats = list(dict.fromkeys(s.category for s in samples))
    report = Report(
        header=run_header(lm).to_json(), command="python benchmarks/refusals.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        draft=args.draft, per_category=args.per_category, tokens=args.tokens, layers=layers,
        load_average_start=load_start, load_average_end=list(os.getloadavg()),
        seconds={"load": t1 - t0, "greedy": t2 - t1, "teacher_forced": t3 - t2},
        greedy_check=agree / max(total, 1),
        by_position=position_rows(slots, lambda x: x.pos),
        by_prompt_length=position_rows(slots, lambda x: x.prompt_len),
        by_category=[category_row(c, [s for s in slots if s.category == c], layers) for c in cats]
        + [category_row("all", slots, layers)],
        ngram=ngram_rows(samples),
        ngram_by_category={c: ngram_rows([s for s in samples if s.category == c]) for c in cats},
    )
    Path(args.out).write_text(json.dumps(asdict(report), indent=1))
    print_report(report)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_report(r: Report) -> None:
    print(f"\ngreedy check (output token == teacher-forced target argmax): {r.greedy_check:.4f}")
    for title, rows in (("absolute position of the draft", r.by_position), ("prompt length", r.by_prompt_length)):
        print(f"\nby {title}: bucket, positions, engine steps, engine, teacher-forced, TF window {WINDOW}, in vocab")
        for p in rows:
            print(f"  {p.bucket:9s} {p.positions:5d} {p.engine_steps:5d} {fmt(p.engine)} {fmt(p.teacher_forced)} "
                  f"{fmt(p.teacher_forced_window)} {fmt(p.in_vocab)}")
    print(f"\nby category: positions, engine (steps), TF at engine steps, TF, TF window, in vocab, head | in vocab, "
          f"top-{TOP_K}, hit after hit (real / own feature), self:L, lookup else head, head or lookup")
    for c in r.by_category:
        print(f"  {c.category:15s} {c.positions:5d} {fmt(c.engine)} ({c.engine_steps}) "
              f"{fmt(c.teacher_forced_at_engine_steps)} {fmt(c.teacher_forced)} {fmt(c.teacher_forced_window)} "
              f"{fmt(c.in_vocab)} {fmt(c.head_given_in_vocab)} {fmt(c.head_top)} {fmt(c.head_after_hit)} "
              f"{fmt(c.head_step2_after_hit)} "
              + " ".join(f"{k} {fmt(v)}" for k, v in c.self_layers.items())
              + " | " + " ".join(f"{k} {fmt(v)}" for k, v in c.lookup_else_head.items())
              + " | " + " ".join(f"{k} {fmt(v)}" for k, v in c.head_or_lookup.items()))
    print("\nn-gram continuations of the target's own text: n, positions, matched, correct, correct | matched")
    for g in r.ngram:
        print(f"  {g.n} {g.positions:5d} {fmt(g.matched)} {fmt(g.correct)} {fmt(g.correct_given_match)}")
    print(f"\nload average {r.load_average_start} -> {r.load_average_end}; seconds {r.seconds}")


if __name__ == "__main__":
    main()
