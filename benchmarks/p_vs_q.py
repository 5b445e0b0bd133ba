"""How much of the target's sampling distribution p do the default drafter's drafts carry at the
chat's sampling? (issue 38 item 1)

Rejection sampling keeps a draft drawn from q with probability sum_x min(p, q) (the overlap);
a lookup draft d (a point mass) with probability p(d). This runs the cascade (ngram:3 + the
eagle head) on held-out prompts at a fixed K = 3, so every step drafts three tokens, and at each
verify pass records, for every draft position the step reached (its earlier drafts kept, so p
is the target's distribution given them):
- ``overlap``: sum min(p, q) with q as drafted, through the same temperature and filters as p;
- ``overlap_raw``: the same p against the head's q at T = 1 without the filters (what drafting
  from the head's plain softmax would give);
- ``p_argmax_q``: p of the head's most likely token (what argmax drafts are kept with);
- ``gumbel``: how often argmax(log q + g) = argmax(log p + g) for shared Gumbel noise g, which is
  what ``--coupled`` keeps (a Monte Carlo mean over ``--noise`` draws);
- for lookup steps, ``p_lookup``: p of the looked-up token.
Records are grouped by setting, prompt category and position.

    python benchmarks/p_vs_q.py [--prompts benchmarks/prompts/heldout-8.jsonl] [-n 96] [--seeds 2] [--noise 32]
        [--out benchmarks/results/p-vs-q.json]

The instrument wraps the torch backend's ``rejection_verify`` (to see p, q and the drafts of each
pass) and the head's ``forward`` (to see its unfiltered row); neither changes a decision.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
import torch

from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.runs import read_prompts_file
from mlxspec.session import Session, SessionOptions
from mlxspec.torchpath import ops as torch_ops
from mlxspec.torchpath.sampling import logprobs

SETTINGS = (("T=1", 1.0, 0.0), ("T=1 min-p=0.1", 1.0, 0.1))  # (label, temperature, min-p)
K = 3


@dataclass(frozen=True)
class Slot:
    """One reached draft position of one verify pass."""

    setting: str
    category: str
    position: int  # 1..K
    source: str  # "head" or "lookup"
    accepted: bool
    overlap: float | None = None
    overlap_raw: float | None = None
    p_argmax_q: float | None = None
    gumbel: float | None = None
    q_token: float | None = None  # q of the drafted token: what a per-step K could read before verifying
    p_lookup: float | None = None


@dataclass(frozen=True)
class Cell:
    setting: str
    category: str
    position: int
    head_slots: int
    accepted_head: float  # the share of reached head drafts the engine kept
    overlap: float | None
    overlap_raw: float | None
    p_argmax_q: float | None
    gumbel: float | None
    lookup_slots: int
    p_lookup: float | None


class Recorder:
    """Wraps ``rejection_verify`` and the head's ``forward`` for one setting's runs."""

    def __init__(self, head, noise: int):
        self.noise, self.raw_rows, self.passes = noise, [], []
        self.head, self._verify, self._forward = head, torch_ops.rejection_verify, head.forward
        torch_ops.rejection_verify = self.verify
        head.forward = self.forward

    def forward(self, *args, **kwargs):
        # each chained draft is drawn from the last row of one head call: its unfiltered row
        pred, z = self._forward(*args, **kwargs)
        self.raw_rows.append(self.head.full_logits(z[0, -1]))
        return pred, z

    def verify(self, draft, q, p, key):
        n, nxt = self._verify(draft, q, p, key)
        if not len(draft):  # a step that drafted nothing still decides its token here
            return n, nxt
        raw = self.raw_rows[-len(draft):] if q is not None else None
        self.passes.append((draft.clone(), None if q is None else q.clone(), p.clone(),
                            None if raw is None else torch.stack(raw), int(n)))
        self.raw_rows = []
        return n, nxt

    def close(self) -> None:
        torch_ops.rejection_verify = self._verify
        del self.head.forward


def slots(setting: str, category: str, passes: list, noise: int) -> list[Slot]:
    out = []
    plain = SamplingParams(temperature=1.0)
    for draft, q, p, raw, kept in passes:
        for j in range(min(kept + 1, len(draft))):  # positions the pass reached
            d, pj = int(draft[j]), p[j].double()
            if q is None:
                out.append(Slot(setting, category, j + 1, "lookup", j < kept, p_lookup=float(pj[d])))
                continue
            qj = q[j].double()
            q_raw = torch.exp(logprobs(raw[j][None], plain)[0].double())[: len(pj)]
            g = -torch.log(-torch.log(torch.rand(noise, len(pj), dtype=torch.float64).clamp_min(1e-300)))
            match = ((torch.log(qj) + g).argmax(-1) == (torch.log(pj) + g).argmax(-1)).double().mean()
            out.append(Slot(setting, category, j + 1, "head", j < kept, float(torch.minimum(pj, qj).sum()),
                            float(torch.minimum(pj, q_raw).sum()), float(pj[int(qj.argmax())]), float(match),
                            float(qj[d])))
    return out


def cells(all_slots: list[Slot]) -> list[Cell]:
    groups: dict[tuple, list[Slot]] = defaultdict(list)
    for s in all_slots:
        groups[(s.setting, s.category, s.position)].append(s)
        groups[(s.setting, "all", s.position)].append(s)

    def mean(xs: list) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(statistics.fmean(xs), 3) if xs else None

    out = []
    for (setting, category, position), group in groups.items():
        head = [s for s in group if s.source == "head"]
        look = [s for s in group if s.source == "lookup"]
        out.append(Cell(setting, category, position, len(head), mean([float(s.accepted) for s in head]),
                        mean([s.overlap for s in head]), mean([s.overlap_raw for s in head]),
                        mean([s.p_argmax_q for s in head]), mean([s.gumbel for s in head]), len(look),
                        mean([s.p_lookup for s in look])))
    return sorted(out, key=lambda c: (c.setting, c.category != "all", c.category, c.position))


BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.01)  # edges of q(drafted token)


@dataclass(frozen=True)
class Calibration:
    """Head slots whose drafted token had q in [low, high): how often the engine kept them."""

    setting: str
    low: float
    high: float
    slots: int
    share: float  # of the setting's head slots
    kept: float | None
    overlap: float | None


def calibration(all_slots: list[Slot]) -> list[Calibration]:
    out = []
    for setting in dict.fromkeys(s.setting for s in all_slots):
        head = [s for s in all_slots if s.setting == setting and s.source == "head"]
        for low, high in zip(BUCKETS, BUCKETS[1:]):
            group = [s for s in head if low <= s.q_token < high]
            out.append(Calibration(setting, low, min(high, 1.0), len(group), round(len(group) / max(len(head), 1), 3),
                                   round(statistics.fmean(float(s.accepted) for s in group), 3) if group else None,
                                   round(statistics.fmean(s.overlap for s in group), 3) if group else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "prompts" / "heldout-8.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--noise", type=int, default=32, help="Gumbel draws per slot for the coupled match rate")
    ap.add_argument("--draft", default="ngram:3+smollm2-135m-eagle", help="a cascade whose last part is an eagle head")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.manual_seed(0)
    items = read_prompts_file(a.prompts)
    session = Session.open(SessionOptions("default", "auto", "torch", a.draft, K)).ready()
    head = session.drafter.parts[-1].head
    all_slots: list[Slot] = []
    for setting, temperature, min_p in SETTINGS:
        params = SamplingParams(temperature=temperature, min_p=min_p)
        for it in items:
            for seed in range(a.seeds):
                rec = Recorder(head, a.noise)
                try:
                    steps = [ev for ev in session.stream(session.encode(it["text"]), params, a.max_tokens, seed)
                             if isinstance(ev, Step)]
                finally:
                    rec.close()
                assert len(rec.passes) == sum(1 for s in steps if s.k), "a drafting step went unrecorded"
                all_slots += slots(setting, it.get("category", "all"), rec.passes, a.noise)
            print(f"{setting} {it['id']}", flush=True)
    table = cells(all_slots)
    print("| setting | position | head slots | kept | overlap (q as drafted) | overlap, unfiltered q | "
          "p(argmax q) | shared-noise match | lookup slots | p(lookup token) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in table:
        if c.category == "all":
            print(f"| {c.setting} | {c.position} | {c.head_slots} | {c.accepted_head} | {c.overlap} | {c.overlap_raw} | "
                  f"{c.p_argmax_q} | {c.gumbel} | {c.lookup_slots} | {c.p_lookup} |")
    calib = calibration(all_slots)
    print("\n| setting | q(drafted token) | head slots (share) | kept | overlap |\n|---|---|---|---|---|")
    for c in calib:
        print(f"| {c.setting} | {c.low:.2f}-{c.high:.2f} | {c.slots} ({c.share}) | {c.kept} | {c.overlap} |")
    if a.out:
        a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "k": K, "drafter": session.drafter.name,
                                     "cells": [asdict(c) for c in table],
                                     "calibration": [asdict(c) for c in calib]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
