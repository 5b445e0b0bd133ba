"""The sampling check's statistics: a two-sample chi-squared test of homogeneity on the pooled
token histograms, and its p-value by paired permutation. Bins: the most frequent token ids of
the pooled sample, at most ``MAX_BINS`` and only ids counted at least ``MIN_POOLED_COUNT`` times,
plus one "other" bin. The asymptotic p assumes independent tokens, which tokens of one sequence
are not; swapping the method labels of each round's two sequences (same prompt) gives a null
that holds whatever the dependence within a sequence, so the verdict rests on that."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2_contingency

from mlxspec.errors import MlxspecError
from mlxspec.measure.equivalence.inputs import METHODS, MethodTotals

ALPHA = 0.01  # the sampling check passes iff its permutation p-value > ALPHA
MAX_BINS = 200  # named token ids at most (dof = number of named ids)
MIN_POOLED_COUNT = 10  # a token id gets its own bin only if counted this often in the pooled sample
PERMUTATIONS = 10_000  # label swaps for the sequence-level permutation p-value
EOS_BIN = -1  # pseudo token id counted once per sequence that ended at a stop token


@dataclass
class Sample:
    """The sequences each method sampled, round by round (``EOS_BIN`` appended to a sequence
    that ended at a stop token: when a sequence ends is part of the distribution too)."""

    seqs: dict[str, list[list[int]]]
    tallies: dict[str, MethodTotals]
    used: Counter  # prompt index -> rounds it was used in
    rounds: int = 0


def contingency_bins(plain: Counter, spec: Counter, max_bins: int = MAX_BINS,
                     min_count: int = MIN_POOLED_COUNT) -> tuple[list[int], np.ndarray]:
    """The named token ids (most frequent in the pooled sample first, ties by id) and the
    2 x (len(ids) + 1) table of counts, last column "other". The "other" column is dropped when
    it is empty in both rows."""
    pooled = plain + spec
    ranked = sorted((i for i, c in pooled.items() if c >= min_count), key=lambda i: (-pooled[i], i))
    ids = ranked[:max_bins]
    rows = []
    for c in (plain, spec):
        named = [c.get(i, 0) for i in ids]
        rows.append(named + [sum(c.values()) - sum(named)])
    table = np.array(rows, dtype=np.int64)
    if table[:, -1].sum() == 0:
        table = table[:, :-1]
    return ids, table


def chi2_stat(rows0: np.ndarray, col_tot: np.ndarray) -> np.ndarray:
    """Pearson chi2 of 2 x B tables given row 0 (P, B) and the fixed column totals (B,)."""
    rows1 = col_tot - rows0
    n = col_tot.sum()
    stat = np.zeros(rows0.shape[0])
    for row in (rows0, rows1):
        expected = row.sum(axis=1, keepdims=True) * col_tot / n
        stat += ((row - expected) ** 2 / expected).sum(axis=1)
    return stat


def permutation_null(plain_seqs: np.ndarray, spec_seqs: np.ndarray, permutations: int = PERMUTATIONS,
                     seed: int = 0) -> np.ndarray:
    """The chi2 statistic under ``permutations`` random label swaps, paired by round.

    ``plain_seqs``/``spec_seqs``: (R, B) binned counts of each round's target-only and
    speculative sequence (same prompt). Under the null the two sequences of a round are
    exchangeable, so swapping their labels at random gives the null distribution of the
    statistic, whatever the dependence between the tokens of one sequence (which makes the
    asymptotic chi2 p-value too small when a few sequences dominate some bins)."""
    rng = np.random.default_rng(seed)
    a, d = plain_seqs.sum(axis=0), (spec_seqs - plain_seqs).astype(np.float64)
    col_tot = (plain_seqs + spec_seqs).sum(axis=0).astype(np.float64)
    out = []
    for start in range(0, permutations, 1000):
        swap = rng.random((min(1000, permutations - start), len(d))) < 0.5
        out.append(chi2_stat(a + swap @ d, col_tot))
    return np.concatenate(out)


def permutation_p(plain_seqs: np.ndarray, spec_seqs: np.ndarray, observed: float,
                  permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """(1 + #{null >= observed}) / (1 + permutations) over ``permutation_null``."""
    null = permutation_null(plain_seqs, spec_seqs, permutations, seed)
    return (int((null >= observed * (1 - 1e-12)).sum()) + 1) / (permutations + 1)


def per_sequence(lists: list[list[int]], bin_ids: list[int], ncols: int) -> np.ndarray:
    """(sequences, ncols) binned counts: named ids in their column, the rest in "other" (the
    last column, when the table has one)."""
    col = {int(i): c for c, i in enumerate(bin_ids)}
    m = np.zeros((len(lists), ncols), dtype=np.int64)
    for r, out in enumerate(lists):
        for tok in out:
            c = col.get(tok, len(bin_ids))
            if c < ncols:
                m[r, c] += 1
    return m



@dataclass(frozen=True)
class Homogeneity:
    """The chi-squared test of the two samples, asymptotic and by paired permutation."""

    bin_ids: list[int]
    table: np.ndarray
    chi2: float
    dof: int
    p: float
    null: np.ndarray
    p_permutation: float


def homogeneity(sample: Sample, seed: int) -> Homogeneity:
    """Bin the pooled sample, test it with ``chi2_contingency``, and against the paired
    permutation null of the same statistic."""
    counts = {m: Counter(tok for seq in sample.seqs[m] for tok in seq) for m in METHODS}
    bin_ids, table = contingency_bins(counts["target_only"], counts["speculative"])
    if table.shape[1] < 2:
        raise MlxspecError(f"too few tokens to bin ({sum(t.tokens for t in sample.tallies.values())}): raise --tokens")
    chi2, p, dof, _ = chi2_contingency(table, correction=False)
    per_seq = {m: per_sequence(sample.seqs[m], bin_ids, table.shape[1]) for m in METHODS}
    null = permutation_null(per_seq["target_only"], per_seq["speculative"], seed=seed)
    p_perm = (int((null >= chi2 * (1 - 1e-12)).sum()) + 1) / (len(null) + 1)
    return Homogeneity(bin_ids, table, float(chi2), int(dof), float(p), null, float(p_perm))
