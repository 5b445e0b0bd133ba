"""The study's statistics with intervals over prompts: Spearman rho with ties averaged (for
weighted resamples at once) and ratios of sums, each with a percentile bootstrap interval that
resamples whole prompts, since the nodes of one prompt are not independent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95
# Fewer prompts than this give no interval: resampling 2 or 3 prompts has only a handful of
# distinct outcomes, and its percentile interval is far narrower than the truth (as verdict.MIN_PAIRS).
MIN_CLUSTERS = 5


def average_ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Ranks (1-based, ties averaged) of ``values`` (n,) in each row of ``weights`` (R, n): the
    ranks the values would get if value i occurred ``weights[r, i]`` times (a resample)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    v = values[order]
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]]) if v.size else np.array([], dtype=np.int64)
    gid = np.cumsum(np.r_[True, v[1:] != v[:-1]]) - 1 if v.size else np.array([], dtype=np.int64)
    w = weights[:, order]
    gsum = np.add.reduceat(w, starts, axis=1) if v.size else w
    before = np.cumsum(gsum, axis=1) - gsum
    ranked = (before + (gsum + 1) / 2)[:, gid]
    out = np.empty_like(ranked)
    out[:, order] = ranked
    return out


def weighted_spearman(x: Sequence[float], y: Sequence[float], weights: np.ndarray) -> np.ndarray:
    """Spearman rho (ties averaged, as scipy's) of (x, y) for each row of ``weights`` (R, n):
    the rho of the sample in which pair i occurs ``weights[r, i]`` times. nan where a row
    has no spread."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    rx, ry = average_ranks(x, w), average_ranks(y, w)
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = rx - (w * rx).sum(axis=1, keepdims=True) / total
        dy = ry - (w * ry).sum(axis=1, keepdims=True) / total
        return (w * dx * dy).sum(axis=1) / np.sqrt((w * dx * dx).sum(axis=1) * (w * dy * dy).sum(axis=1))


@dataclass(frozen=True)
class Estimate:
    """A statistic with its percentile bootstrap interval over prompts (None: too few)."""

    value: float | None
    lo: float | None = None
    hi: float | None = None
    n: int = 0  # the observations it rests on (nodes or steps)
    clusters: int = 0  # prompts resampled

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def cell(self, spec: str = "{:+.2f}") -> str:
        if self.value is None:
            return "-"
        iv = "" if self.lo is None else f" [{spec.format(self.lo)}, {spec.format(self.hi)}]"
        return spec.format(self.value) + iv


def _cluster_weights(clusters: Sequence[Any], rng: np.random.Generator, resamples: int) -> tuple[np.ndarray, int]:
    """(R, n) multiplicities of n observations when their ``clusters`` are resampled with
    replacement R times; and the number of clusters."""
    keys = {c: i for i, c in enumerate(dict.fromkeys(clusters))}
    cid = np.array([keys[c] for c in clusters], dtype=np.int64)
    k = len(keys)
    picks = rng.integers(0, k, size=(resamples, k))
    counts = np.zeros((resamples, k))
    np.add.at(counts, (np.repeat(np.arange(resamples), k), picks.ravel()), 1.0)
    return counts[:, cid], k


def _interval(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    tail = (1 - level) / 2
    lo, hi = np.quantile(values, [tail, 1 - tail])
    return float(lo), float(hi)


def spearman_estimate(x: Sequence[float], y: Sequence[float], clusters: Sequence[Any], resamples: int = RESAMPLES,
                      seed: int = 0, level: float = LEVEL) -> Estimate:
    """Spearman rho of (x, y) with a percentile bootstrap interval that resamples whole
    clusters (prompts); no interval with fewer than ``MIN_CLUSTERS``."""
    n = len(x)
    if n < 3:
        return Estimate(None, n=n)
    rho = float(weighted_spearman(x, y, np.ones((1, n)))[0])
    if not math.isfinite(rho):
        return Estimate(None, n=n, clusters=len(set(clusters)))
    k = len(set(clusters))
    if k < MIN_CLUSTERS:
        return Estimate(rho, n=n, clusters=k)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 2_000_000 // max(n, 1)))  # bound memory: (chunk, n) float arrays
    values = []
    for start in range(0, resamples, chunk):
        w, _ = _cluster_weights(clusters, rng, min(chunk, resamples - start))
        values.append(weighted_spearman(x, y, w))
    lo, hi = _interval(np.concatenate(values), level)
    return Estimate(rho, lo, hi, n, k)


def ratio_estimate(num: Sequence[float], den: Sequence[float], clusters: Sequence[Any], resamples: int = RESAMPLES,
                   seed: int = 0, level: float = LEVEL) -> Estimate:
    """sum(num) / sum(den) with a bootstrap interval over clusters (none with fewer than
    ``MIN_CLUSTERS``)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if den.sum() <= 0:
        return Estimate(None, n=len(num))
    value = float(num.sum() / den.sum())
    k = len(set(clusters))
    if k < MIN_CLUSTERS:
        return Estimate(value, n=len(num), clusters=k)
    w, _ = _cluster_weights(clusters, np.random.default_rng(seed), resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval((w @ num) / (w @ den), level)
    return Estimate(value, lo, hi, len(num), k)


def paired_ratio_difference(num_a: Sequence[float], den_a: Sequence[float], num_b: Sequence[float],
                            den_b: Sequence[float], resamples: int = RESAMPLES, seed: int = 0,
                            level: float = LEVEL) -> Estimate:
    """sum(num_a) / sum(den_a) - sum(num_b) / sum(den_b) over paired observations (index i of
    both arrays: one prompt measured both ways), with a bootstrap interval that resamples the
    pairs, so what the pairs share (the prompt's difficulty) cancels; none under ``MIN_CLUSTERS``."""
    a, da, b, db = (np.asarray(x, dtype=np.float64) for x in (num_a, den_a, num_b, den_b))
    n = len(a)
    if da.sum() <= 0 or db.sum() <= 0:
        return Estimate(None, n=n, clusters=n)
    value = float(a.sum() / da.sum() - b.sum() / db.sum())
    if n < MIN_CLUSTERS:
        return Estimate(value, n=n, clusters=n)
    w, _ = _cluster_weights(range(n), np.random.default_rng(seed), resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval((w @ a) / (w @ da) - (w @ b) / (w @ db), level)
    return Estimate(value, lo, hi, n, n)
