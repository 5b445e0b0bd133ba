"""Who drafts in a cascade, and how often each part is right: per Spec-Bench category, the share of
steps lookup drafted, the head drafted, or nothing was drafted, and each part's accepted drafts
per drafting step and first-draft acceptance, greedy and at T = 1.

Counts, not timings: every step drafts a fixed K (``--k``, default 4), so nothing depends on how
busy the machine is. Held-out prompts are bench's (the first ``--per-category`` Spec-Bench
questions per category; draft training removes every Spec-Bench turn).

    python benchmarks/cascade_sources.py [--draft ngram:3+smollm2-135m-eagle] [--per-category 2]
        [--tokens 96] [--k 4] [--out benchmarks/results/cascade-sources.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.drafters.cascade import CascadeDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.runs import encode_prompts, run_header, spec_bench_prompts
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load
from mlxspec.targets.tokenizer import stop_token_ids


@dataclass
class PartTally:
    """One part's (or no part's) steps in one category at one temperature."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    first_accepted: int = 0

    def add(self, step: Step) -> None:
        self.steps += 1
        self.drafted += step.k
        self.accepted += step.accepted
        self.first_accepted += step.accepted > 0


@dataclass(frozen=True)
class Row:
    temperature: float
    category: str
    source: str  # a part's name, or "none" (nothing to draft: K room 0 or an empty proposal)
    steps: int
    share: float  # of the category's steps
    accepted_per_step: float | None
    first_draft_acceptance: float | None


def tally(lm, drafter: CascadeDrafter, ids: list[int], params: SamplingParams, tokens: int, k: int, stop: set[int],
          out: dict[str, PartTally]) -> None:
    for ev in generate(lm.model, ids, params, tokens, stop, 8192, 0, drafter, k):
        if isinstance(ev, Step):
            out.setdefault(drafter.parts[drafter.used].name if ev.k else "none", PartTally()).add(ev)


def rows_of(t: float, category: str, parts: dict[str, PartTally]) -> list[Row]:
    total = sum(p.steps for p in parts.values())
    return [Row(t, category, name, p.steps, p.steps / total, p.accepted / p.steps if p.drafted else None,
                p.first_accepted / p.steps if p.drafted else None) for name, p in sorted(parts.items())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default="ngram:3+smollm2-135m-eagle")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cascade-sources.json"))
    a = ap.parse_args()
    lm = load("default", backend="torch:cpu")
    drafter = make_drafter(a.draft, lm)
    if not isinstance(drafter, CascadeDrafter):
        raise SystemExit(f"{a.draft!r} is not a cascade (A+B)")
    items, _ = spec_bench_prompts(None, a.per_category)
    ids = encode_prompts(lm, items, a.tokens)
    stop = stop_token_ids(lm.tokenizer)
    rows: list[Row] = []
    for t in (float(x) for x in a.temps.split(",")):
        overall: dict[str, PartTally] = {}
        by_category: dict[str, dict[str, PartTally]] = {}
        for it, p in zip(items, ids):
            parts = by_category.setdefault(it["category"], {})
            tally(lm, drafter, p, SamplingParams(temperature=t), a.tokens, a.k, stop, parts)
            print(f"T={t:g} {it['category']} #{it['id']}", flush=True)
        for category, parts in by_category.items():
            rows += rows_of(t, category, parts)
            for name, p in parts.items():
                o = overall.setdefault(name, PartTally())
                o.steps, o.drafted, o.accepted, o.first_accepted = (o.steps + p.steps, o.drafted + p.drafted,
                                                                    o.accepted + p.accepted,
                                                                    o.first_accepted + p.first_accepted)
        rows += rows_of(t, "all", overall)
    a.out.write_text(json.dumps({**run_header(lm).to_json(), "settings": vars(a) | {"out": str(a.out)},
                                 "rows": [asdict(r) for r in rows]}, indent=1))
    print("| T | category | drafted by | steps | share | accepted/step | first-draft acceptance |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda x: "" if x is None else f"{x:.2f}"
    for r in rows:
        print(f"| {r.temperature:g} | {r.category} | {r.source} | {r.steps} | {r.share:.2f} | "
              f"{fmt(r.accepted_per_step)} | {fmt(r.first_draft_acceptance)} |")


if __name__ == "__main__":
    main()
