"""Offline, deterministic chat examples for draft-head training, broad enough for what users ask.

Each example is a prompt and a *real* response (the target is teacher-forced over it, so nothing
is invented): worked solutions and reference code from ``../shared/data`` (``shared_data``), or
openly licensed text from Debian packages, whole or a faithful piece (``python_doc``, ``wordnet``,
``fortunes``, ``manpages``). ``CATEGORIES`` cover Spec-Bench's and MT-Bench's subtasks. No
benchmark text is used: ``BenchmarkGuard`` drops any example matching a benchmark turn. A source
whose package is missing is skipped with a warning and reported as ``source/<name>/missing = 1``;
``make draft-data-deps`` installs the packages. Licences and what is taken: ``../SOURCES.md``.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from mlxspec.training.corpus.fortunes import FORTUNE_FILES, fortune_examples, read_fortunes
from mlxspec.training.corpus.guard import BenchmarkGuard
from mlxspec.training.corpus.manpages import align_pages, manpage_examples
from mlxspec.training.corpus.python_doc import python_doc_examples
from mlxspec.training.corpus.records import (
    CATEGORIES,
    MAX_PASSAGE,
    MAX_RESPONSE,
    Example,
    PackagePaths,
    SourceMissing,
)
from mlxspec.training.corpus.roff import roff_blocks, roff_inline
from mlxspec.training.corpus.rst import rst_blocks, rst_inline
from mlxspec.training.corpus.shared_data import folio_examples, gsm8k_examples, humaneval_examples
from mlxspec.training.corpus.text import sentences
from mlxspec.training.corpus.wordnet import read_wordnet, wordnet_examples

__all__ = ["CATEGORIES", "FORTUNE_FILES", "MAX_PASSAGE", "MAX_RESPONSE", "SOURCE_NAMES", "BenchmarkGuard",
           "Example", "PackagePaths", "SourceMissing", "align_pages", "build_corpus", "missing_sources",
           "read_fortunes", "read_wordnet", "roff_blocks", "roff_inline", "rst_blocks", "rst_inline", "sentences",
           "system_paths"]

SOURCE_NAMES = ("gsm8k", "humaneval", "folio", "python3.11-doc", "wordnet-base", "fortunes", "manpages-de")

Pools = dict[str, dict[str, list[Example]]]  # category -> source -> its shuffled candidates


def system_paths() -> PackagePaths:
    """Where this machine's packages put their text (the test session points it at nothing)."""
    return PackagePaths()


def build_corpus(data_dir: Path, limit_per_category: int, seed: int = 0,
                 paths: PackagePaths | None = None) -> tuple[list[Example], dict[str, int]]:
    """Up to ``limit_per_category`` examples per category, deterministic in ``seed``.

    Stats keys: ``category/<c>/examples``, ``category/<c>/chars`` (prompt + response),
    ``category/<c>/response_chars``, ``category/<c>/candidates`` (before the limit and the
    benchmark guard; lazy sources stop at 4x the limit), the same under ``source/<s>/``, ``source/<s>/missing``
    (1 when its package or file is absent), ``source/<s>/benchmark_dropped``, ``total/...``,
    ``benchmark_turns`` and ``source/manpages-de/en-pages-from/<package>`` (the Debian package
    of each English original used for translation pairs)."""
    data_dir = Path(data_dir)
    guard = BenchmarkGuard(data_dir)
    stats: dict[str, int] = {"benchmark_turns": len(guard)}
    pools = _read_sources(data_dir, paths or system_paths(), limit_per_category, seed, stats)
    examples = _select(pools, limit_per_category, guard, stats)
    _count(examples, stats)
    return examples, stats


def missing_sources(stats: dict[str, int]) -> list[str]:
    return [k.split("/")[1] for k, v in stats.items() if k.endswith("/missing") and v]


def _rng(seed: int, name: str) -> random.Random:
    return random.Random(f"{seed}:{name}")


def _read_sources(data_dir: Path, paths: PackagePaths, limit_per_category: int, seed: int,
                  stats: dict[str, int]) -> Pools:
    """Every source's candidates, each shuffled with its own seeded generator; a missing source
    is warned about and marked in ``stats``."""
    want = max(4 * limit_per_category, 64)  # candidates a lazy source needs to produce
    readers: dict[str, Callable[[], dict[str, list[Example]]]] = {
        "gsm8k": lambda: gsm8k_examples(data_dir, _rng(seed, "gsm8k")),
        "humaneval": lambda: humaneval_examples(data_dir, _rng(seed, "humaneval")),
        "folio": lambda: folio_examples(data_dir, _rng(seed, "folio")),
        "python3.11-doc": lambda: python_doc_examples(paths, _rng(seed, "python3.11-doc")),
        "wordnet-base": lambda: wordnet_examples(paths, _rng(seed, "wordnet-base"), want),
        "fortunes": lambda: fortune_examples(paths, _rng(seed, "fortunes")),
        "manpages-de": lambda: manpage_examples(paths, _rng(seed, "manpages-de"), want, stats),
    }
    pools: Pools = {c: {} for c in CATEGORIES}
    for name in SOURCE_NAMES:
        try:
            got = readers[name]()
        except (SourceMissing, FileNotFoundError, NotADirectoryError) as e:
            warnings.warn(f"training corpus: source {name} skipped, not found ({e}); "
                          "`make draft-data-deps` installs the Debian packages", stacklevel=3)
            stats[f"source/{name}/missing"] = 1
            continue
        for cat, exs in got.items():
            if exs:
                exs = list(exs)
                _rng(seed, f"{name}:{cat}").shuffle(exs)
                pools[cat][name] = exs
                stats[f"category/{cat}/candidates"] = stats.get(f"category/{cat}/candidates", 0) + len(exs)
    return pools


def _select(pools: Pools, limit: int, guard: BenchmarkGuard, stats: dict[str, int]) -> list[Example]:
    """Up to ``limit`` examples per category, sources interleaved, benchmark text dropped (and
    counted per source in ``stats``)."""
    dropped: dict[str, int] = {}
    examples: list[Example] = []
    for cat in CATEGORIES:
        examples.extend(_interleave(pools[cat], limit,
                                    lambda ex: not (guard.hit(ex.prompt) or guard.hit(ex.response)), dropped))
    for name, n in dropped.items():
        stats[f"source/{name}/benchmark_dropped"] = n
    return examples


def _interleave(pools: dict[str, list[Example]], limit: int, keep: Callable[[Example], bool],
                dropped: dict[str, int]) -> list[Example]:
    """Round-robin over sources (each already shuffled) so every source is represented."""
    its: dict[str, Iterator[Example]] = {s: iter(v) for s, v in pools.items() if v}
    out: list[Example] = []
    while its and len(out) < limit:
        for s in list(its):
            if len(out) >= limit:
                break
            for ex in its[s]:
                if keep(ex):
                    out.append(ex)
                    break
                dropped[s] = dropped.get(s, 0) + 1
            else:
                del its[s]
    return out


def _count(examples: list[Example], stats: dict[str, int]) -> None:
    """Examples, characters and response characters per category, per source and in total."""
    for ex in examples:
        for key in (f"category/{ex.category}", f"source/{ex.source}", "total"):
            stats[f"{key}/examples"] = stats.get(f"{key}/examples", 0) + 1
            stats[f"{key}/chars"] = stats.get(f"{key}/chars", 0) + len(ex.prompt) + len(ex.response)
            stats[f"{key}/response_chars"] = stats.get(f"{key}/response_chars", 0) + len(ex.response)
    for cat in CATEGORIES:
        stats.setdefault(f"category/{cat}/examples", 0)
