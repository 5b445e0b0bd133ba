"""Verdicts as a type, and the paired statistics a "faster" or "slower" verdict rests on.

Timings on a shared machine drift and jump (the same pass measured 77 and 170 ms within one
run here), so a ratio of two medians says little by itself. Every comparison is *paired*: both
methods ran the same prompt back to back in the same repeat, so prompt difficulty and slow drift
cancel in each pair's ratio. The interval is a percentile bootstrap over the pairs (numpy,
seeded: the same runs always give the same verdict), of the same statistic the command reports.

* ``faster`` iff the 95% interval lies above 1.0, ``slower`` iff below, otherwise ``no
  measurable difference``, with the interval shown;
* fewer than ``MIN_PAIRS`` pairs never give faster or slower: a percentile bootstrap over two
  or three pairs is far narrower than the truth (two pairs both above 1 would "exclude" 1.0).

Renderers colour a verdict by its ``kind`` (``STYLES``), never by its words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

LEVEL = 0.95
RESAMPLES = 4000
MIN_PAIRS = 5


class Kind(str, Enum):
    FASTER = "faster"  # the first method is faster, the interval excludes 1.0
    SLOWER = "slower"  # the first method is slower, the interval excludes 1.0
    SAME = "no measurable difference"  # the interval includes 1.0, or too few pairs
    EMPTY = "no data"  # nothing was measured
    INFO = "info"  # a neutral finding (a prediction, a peer's numbers)
    NOTE = "note"  # a qualification of the headline
    CAUSE = "cause"  # why speculation does not pay
    BUG = "bug"  # a correctness failure (greedy outputs differ)
    PASS = "pass"
    FAIL = "fail"


STYLES: dict[Kind, str] = {
    Kind.FASTER: "bold green", Kind.SLOWER: "bold red", Kind.SAME: "bold yellow", Kind.EMPTY: "dim",
    Kind.INFO: "", Kind.NOTE: "yellow", Kind.CAUSE: "red", Kind.BUG: "bold red",
    Kind.PASS: "bold green", Kind.FAIL: "bold red",
}


def style(kind: Kind) -> str:
    """The rich style of a verdict of ``kind`` ("" for plain)."""
    return STYLES[kind]


def markup(kind: Kind, text: str) -> str:
    """``text`` in rich markup coloured for ``kind`` (the text is not escaped)."""
    s = STYLES[kind]
    return f"[{s}]{text}[/]" if s else text


@dataclass(frozen=True)
class Interval:
    """A ``level`` confidence interval of a ratio, from ``pairs`` paired runs."""

    lo: float
    hi: float
    level: float = LEVEL
    pairs: int = 0

    def excludes(self, x: float = 1.0) -> bool:
        return x < self.lo or x > self.hi

    def __str__(self) -> str:
        return f"{self.lo:.2f}x-{self.hi:.2f}x"

    def to_json(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "level": self.level, "pairs": self.pairs}


@dataclass(frozen=True)
class Comparison:
    """A paired ratio, first method over second, with its bootstrap interval."""

    ratio: float | None
    interval: Interval | None
    pairs: int

    @property
    def kind(self) -> Kind:
        if self.ratio is None:
            return Kind.EMPTY
        if self.interval is None or self.pairs < MIN_PAIRS or not self.interval.excludes(1.0):
            return Kind.SAME
        return Kind.FASTER if self.interval.lo > 1.0 else Kind.SLOWER

    def describe(self) -> str:
        """The evidence in words: "95% interval 0.91x-1.18x over 6 paired runs"."""
        if self.interval is None:
            return f"{self.pairs} paired run(s): no interval"
        text = f"{self.interval.level:.0%} interval {self.interval} over {self.pairs} paired runs"
        if self.pairs < MIN_PAIRS:
            text += f": too few to tell (at least {MIN_PAIRS}; add prompts or --repeats)"
        return text


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    text: str
    interval: Interval | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "text": self.text,
                "interval": None if self.interval is None else self.interval.to_json()}


def _bootstrap(n: int, statistic: Callable[[np.ndarray], np.ndarray], seed: int, resamples: int,
               level: float) -> Interval:
    """Percentile interval of ``statistic`` (index array (R, n) -> (R,) values) over ``resamples``
    resamplings of n pairs with replacement."""
    rng = np.random.default_rng(seed)
    values = statistic(rng.integers(0, n, size=(resamples, n)))
    values = values[np.isfinite(values)]
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(values, [tail, 1.0 - tail]) if values.size else (np.nan, np.nan)
    return Interval(float(lo), float(hi), level, n)


def pooled_ratio(a_tokens: Sequence[float], a_seconds: Sequence[float], b_tokens: Sequence[float],
                 b_seconds: Sequence[float], seed: int = 0, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> Comparison:
    """(sum a tokens / sum a seconds) / (sum b tokens / sum b seconds) over paired runs (same
    index = same prompt and repeat), with its bootstrap interval."""
    at, as_, bt, bs = (np.asarray(x, dtype=np.float64) for x in (a_tokens, a_seconds, b_tokens, b_seconds))
    n = len(at)
    if n == 0 or as_.sum() <= 0 or bs.sum() <= 0 or bt.sum() <= 0:
        return Comparison(None, None, n)

    def stat(idx: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (at[idx].sum(1) / as_[idx].sum(1)) / (bt[idx].sum(1) / bs[idx].sum(1))

    ratio = float((at.sum() / as_.sum()) / (bt.sum() / bs.sum()))
    return Comparison(ratio, _bootstrap(n, stat, seed, resamples, level), n)


def median_ratio(ratios: Sequence[float], seed: int = 0, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> Comparison:
    """The median of per-pair ratios (a tps / b tps of the same prompt and repeat), with its
    bootstrap interval."""
    r = np.asarray([x for x in ratios if x is not None and np.isfinite(x)], dtype=np.float64)
    if r.size == 0:
        return Comparison(None, None, 0)
    return Comparison(float(np.median(r)), _bootstrap(r.size, lambda idx: np.median(r[idx], axis=1), seed,
                                                      resamples, level), int(r.size))
