"""Does an eagle head agree with the target as often along the target's own text as along
people's? For the first corpus prompts, the head's teacher-forced first-draft agreement with the
target's argmax along two answers to the same prompt: the corpus's (people's) and the target's
own (``training/written.py``; even prompts greedy, odd sampled at T = 1). Everything comes from
the feature cache the eagle recipe fills (`train-draft --arch eagle --target-written N`), so only
the head runs here.

    python benchmarks/written_agreement.py --draft smollm2-135m-eagle --draft /tmp/other --prompts 3300
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import mlx.core as mx
import numpy as np

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.targets import store
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load
from mlxspec.training.eagle_train import corpus_examples, prepare_features
from mlxspec.training.features import FeatureSet
from mlxspec.training.written import written_examples


@dataclass
class TextAgreement:
    draft: str
    text: str  # people, target-greedy, target-T1
    answers: int
    positions: int
    agreement: float


def agreement(head, data: FeatureSet, rows: list[int]) -> tuple[int, int]:
    """(positions, agreements) over the response positions of examples ``rows``: the head reads
    the target's real feature at slot s and token x_{s+1}; does its argmax equal the target's?"""
    off, hits, total = data.offsets, 0, 0
    for r in rows:
        lo, n, rs = int(off[r]), int(data.lengths[r]), int(data.response_start[r])
        feats = mx.array(data.features[lo : lo + n - 1].astype(np.float32))[None]
        _, z = head(feats, mx.array(data.tokens[lo + 1 : lo + n])[None])
        guess = np.array(head.vocab_ids[mx.argmax(z[0], axis=-1)])
        want = data.argmax[lo + 1 : lo + n]
        s = max(rs - 2, 0)  # slot s predicts position s + 2: from the first response token on
        hits += int((guess[s:] == want[s:]).sum())
        total += n - 1 - s
    return total, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", action="append", help="eagle heads to compare (repeat)")
    ap.add_argument("--prompts", type=int, default=3300, help="the first N corpus prompts")
    ap.add_argument("--out")
    args = ap.parse_args()
    lm = load("default", "float32")
    data = prepare_features(lm, 300, args.prompts, 0, 256, target_written=args.prompts)
    examples, _ = corpus_examples(300, 0)
    answers = written_examples(lm, examples[: args.prompts], store.home() / "eagle-data" / "written", 128, 0, 128)
    assert len(answers) == len(data.lengths) - args.prompts  # the order prepare_features built them in
    groups: dict[str, list[int]] = {"people": list(range(args.prompts))}
    for i, a in enumerate(answers):
        groups.setdefault(a.source, []).append(args.prompts + i)
    rows = []
    for name in args.draft or ["smollm2-135m-eagle"]:
        head = make_drafter(name, lm).head
        for text, idx in groups.items():
            positions, hits = agreement(head, data, idx)
            rows.append(TextAgreement(name, text, len(idx), positions, hits / max(positions, 1)))
            print(f"{name:28s} {text:14s} {len(idx):5d} answers {positions:7d} positions  agreement "
                  f"{rows[-1].agreement:.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"prompts": args.prompts, "rows": [asdict(r) for r in rows]}, f, indent=2)


if __name__ == "__main__":
    main()
