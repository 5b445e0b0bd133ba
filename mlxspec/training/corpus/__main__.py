"""``python -m mlxspec.training.corpus``: build the draft-training corpus and print its stats."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from mlxspec.targets.store import data_dir
from mlxspec.training.corpus import build_corpus


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the draft-training corpus and print its stats.")
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the examples as JSONL")
    a = ap.parse_args(list(argv) if argv is not None else None)
    exs, stats = build_corpus(a.data_dir or data_dir(), a.limit, a.seed)
    for k in sorted(stats):
        print(f"{k}\t{stats[k]}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            for e in exs:
                f.write(json.dumps(e.__dict__, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
