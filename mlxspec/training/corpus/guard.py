"""The benchmark guard: no Spec-Bench or MT-Bench text may enter the training corpus."""

from __future__ import annotations

import json
from pathlib import Path

from mlxspec.training.distill import benchmark_texts, is_benchmark, normalise


class BenchmarkGuard:
    """``is_benchmark`` over Spec-Bench and MT-Bench turns, with an exact pre-filter.

    If a text t (>= 40 chars) lies inside a benchmark turn b, then t's 2nd-4th words are a word
    trigram of b; if b lies inside t, then b's 2nd-4th words are a trigram of t. Texts that pass
    neither test (and are not equal to a turn) cannot match, so only candidates pay for the
    full scan. Texts too short for the trigram argument always get the full check."""

    def __init__(self, data_dir: Path):
        bench = list(benchmark_texts(data_dir))
        mt = data_dir / "mt_bench_questions.jsonl"
        if mt.is_file():
            for line in mt.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    bench.extend(normalise(t) for t in json.loads(line).get("turns", []))
        self.bench = list(dict.fromkeys(bench))
        self.bench_set = set(self.bench)
        self.trigrams: set[tuple[str, ...]] = set()
        self.keys: set[tuple[str, ...]] = set()
        self.unkeyed: list[str] = []  # long turns with too few words for a key
        for b in self.bench:
            w = b.split(" ")
            self.trigrams.update(zip(w, w[1:], w[2:]))
            if len(w) >= 5:
                self.keys.add(tuple(w[1:4]))
            elif len(b) >= 40:
                self.unkeyed.append(b)

    def __len__(self) -> int:
        return len(self.bench)

    def hit(self, text: str) -> bool:
        t = normalise(text)
        if t in self.bench_set:
            return True
        if len(t) < 40:
            return False  # is_benchmark needs an exact match below 40 characters
        w = t.split(" ")
        if len(w) < 5:
            return is_benchmark(text, self.bench, self.bench_set)
        candidate = tuple(w[1:4]) in self.trigrams
        if not candidate and self.keys:
            candidate = not self.keys.isdisjoint(zip(w, w[1:], w[2:]))
        if not candidate:
            candidate = any(b in t for b in self.unkeyed)
        return candidate and is_benchmark(text, self.bench, self.bench_set)
