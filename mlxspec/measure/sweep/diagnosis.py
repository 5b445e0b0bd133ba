"""The sweep's verdict from its numbers: the optimum K, measured and predicted, whether
speculation pays there (only when the 95% interval of its paired speedup lies above 1.0), the
Ks that cannot be told from it, and for a loss the causes in plain words:

* ``draft_too_slow``: draft ms per token >= DRAFT_TOO_SLOW x target ms per token;
* ``serial_verify`` / ``partly_serial_verify``: verify cost slope (``verify_slope``) >=
  SERIAL_SLOPE / PARTLY_SERIAL_SLOPE;
* ``low_acceptance``: first-position acceptance < LOW_ACCEPTANCE at the best K, or no cost
  cause and the cost model also predicts no gain;
* ``overhead``: none of these, the cost model predicts a gain the run does not see.
When speculation pays, the cost causes that apply are kept as notes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxspec.measure.sweep.costmodel import (
    DRAFT_TOO_SLOW,
    LOW_ACCEPTANCE,
    Prediction,
    argbest,
    cost_model,
    tied_with_best,
    verify_kind,
    verify_slope,
)
from mlxspec.measure.verdict import Comparison, Interval, Kind, Verdict


@dataclass(frozen=True)
class Optimum:
    k: int
    tps: float
    speedup: float | None
    interval: Interval | None = None
    indistinguishable: list[int] = field(default_factory=list)  # Ks not measurably slower than this one

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "tps": self.tps, "speedup": self.speedup,
                "interval": None if self.interval is None else self.interval.to_json(),
                "indistinguishable": list(self.indistinguishable)}


@dataclass(frozen=True)
class Cause:
    cause: str  # draft_too_slow | serial_verify | partly_serial_verify | low_acceptance | overhead
    message: str


@dataclass(frozen=True)
class Diagnosis:
    optimum_measured: Optimum | None
    optimum_predicted: Optimum | None
    pays: bool
    predicted: list[Prediction]
    verify_slope: float
    verify_kind: str
    causes: list[Cause]
    verdict: list[Verdict]


@dataclass(frozen=True)
class Measured:
    """What ``diagnose`` judges. Per K (parallel lists): ``tps`` the measured median,
    ``speedup`` the paired speedup over target-only with its interval, ``acceptance``
    conditional per position, ``draft_ms_per_token``, ``verify_ms`` one target pass over K+1
    tokens. Then ``target_ms`` (one pass over one token), target-only tokens/s, and optionally
    per K how often the drafter proposed a token at each position (``coverage``) and tokens/s
    per (prompt, repeat) (``paired_tps``, to name the Ks indistinguishable from the best)."""

    ks: Sequence[int]
    tps: Sequence[float]
    speedup: Sequence[Comparison]
    acceptance: Sequence[Sequence[float | None]]
    draft_ms_per_token: Sequence[float]
    verify_ms: Sequence[float]
    target_ms: float
    baseline_tps: float | None = None
    coverage: Sequence[Sequence[float | None]] | None = None
    paired_tps: Sequence[Sequence[float]] | None = None

    @property
    def verify_ratios(self) -> list[float]:
        """Each K's verify pass in one-token passes."""
        t = self.target_ms
        return [v / t for v in self.verify_ms] if t > 0 else [math.inf] * len(self.ks)


def _g(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"


def _headline(best: Optimum, c: Comparison, baseline_tps: float | None) -> Verdict:
    base = f" ({best.tps:.1f} vs {baseline_tps:.1f} tok/s)" if baseline_tps else f" ({best.tps:.1f} tok/s)"
    sp, k, kind = c.ratio, best.k, c.kind
    if kind is Kind.FASTER:
        text = f"best K = {k}: {sp:.2f}x target-only{base} — speculation pays here ({c.describe()})"
    elif kind is Kind.SLOWER:
        text = (f"speculation does not pay here: the best K = {k} reaches only {sp:.2f}x target-only{base}; "
                f"decode without a draft ({c.describe()})")
    else:
        text = (f"no measurable difference from target-only: the best K = {k} reaches {sp:.2f}x{base}, "
                f"but the {c.describe()} includes 1.0 — speculation does not measurably pay here")
    return Verdict(kind, text, c.interval)


def _ties_line(best: Optimum) -> Verdict:
    ties = best.indistinguishable
    names = ", ".join(f"K={k}" for k in ties)
    return Verdict(Kind.NOTE, f"note: {names} {'is' if len(ties) == 1 else 'are'} indistinguishable from the best "
                              f"K = {best.k} (the 95% interval of their paired tokens/s over K = {best.k}'s includes "
                              f"1.0): any of them will do")


def _prediction_line(p: Optimum, measured_k: int) -> Verdict:
    agree = "agrees" if p.k == measured_k else f"measured best K = {measured_k}"
    return Verdict(Kind.INFO, f"cost model (measured acceptance and costs) predicts best K = {p.k}: {p.tps:.1f} "
                              f"tok/s, {p.speedup:.2f}x — {agree}")


def _cost_causes(ks: Sequence[int], i: int, draft_ms: float, target_ms: float, ratios: Sequence[float],
                 slope: float, won: float) -> list[Cause]:
    """Causes in the costs, judged at K = ks[i]: a slow draft, serial verification."""
    k = ks[i]
    r = draft_ms / target_ms if target_ms > 0 else math.inf
    causes = []
    if r >= DRAFT_TOO_SLOW:
        causes.append(Cause("draft_too_slow",
                            f"draft costs {_g(r)}x the target — too slow to pay ({draft_ms:.1f} ms per draft token "
                            f"vs {target_ms:.1f} ms per target token; at K={k} drafting costs {k * r:.2f} target "
                            f"tokens per step and wins {won:.2f})"))
    top = max(range(len(ks)), key=lambda j: ks[j])  # the largest K: where serial verification shows most
    kind = verify_kind(slope)
    if kind == "serial":
        causes.append(Cause("serial_verify",
                            f"verify cost grows ~linearly with K — this backend verifies serially (a pass over K+1 = "
                            f"{ks[top] + 1} tokens costs {ratios[top]:.1f}x one token; batch-parallel would stay near "
                            f"1x; +{slope:.2f} of a token per extra draft)"))
    elif kind == "partly serial":
        causes.append(Cause("partly_serial_verify",
                            f"verify cost grows with K — verification is only partly batch-parallel here (+{slope:.2f} "
                            f"of a token per extra draft; a pass over {ks[top] + 1} tokens costs {ratios[top]:.1f}x "
                            f"one)"))
    return causes


def _loss_causes(k: int, a1: float, won: float, overhead: float, cov1: float, predicted: float,
                 measured: float, cost_cause: bool) -> list[Cause]:
    """Causes of a loss beyond the costs: low acceptance, or overhead the model does not see."""
    if a1 < LOW_ACCEPTANCE or (not cost_cause and predicted < 1.0):
        return [Cause("low_acceptance",
                      f"acceptance too low: {a1:.0%} of first drafts accepted, {won:.2f} tokens won per step at K={k}, "
                      f"against a step overhead of {overhead:.2f} target tokens"
                      + (f"; the drafter proposed nothing in {1 - cov1:.0%} of steps" if cov1 < 0.9 else ""))]
    if not cost_cause:
        return [Cause("overhead",
                      f"per-step overhead outside the cost model (host syncs, sampling, cache rollback, prefill) eats "
                      f"the gain: predicted {predicted:.2f}x at K={k}, measured {measured:.2f}x")]
    return []


def _causes(m: Measured, i: int, at: Prediction, c: Comparison, slope: float) -> list[Cause]:
    """Why, judged at the best K = ``m.ks[i]`` (``at``: the cost model there): the cost causes,
    and for a loss the causes beyond them."""
    ratios = m.verify_ratios
    acc = m.acceptance[i]
    a1 = acc[0] if acc and acc[0] is not None else 0.0
    won = at.expected_tokens - 1.0  # drafts accepted per step
    causes = _cost_causes(list(m.ks), i, m.draft_ms_per_token[i], m.target_ms, ratios, slope, won)
    if c.kind is not Kind.FASTER:
        r = m.draft_ms_per_token[i] / m.target_ms if m.target_ms > 0 else math.inf
        overhead = m.ks[i] * r + (ratios[i] - 1.0)  # extra cost of a step over one target token, in target tokens
        cov = m.coverage
        cov1 = cov[i][0] if cov and cov[i] and cov[i][0] is not None else 1.0
        causes += _loss_causes(m.ks[i], a1, won, overhead, cov1, at.speedup, c.ratio, bool(causes))
    return causes


def diagnose(m: Measured) -> Diagnosis:
    """The optimum, measured and predicted, and the verdict in words (headline, ties, the cost
    model's prediction, then causes: notes when speculation pays, reasons when it does not).
    Pure: numbers in, words out."""
    ks = list(m.ks)
    model = cost_model(ks, m.acceptance, m.draft_ms_per_token, m.verify_ms, m.target_ms)
    bm, bp = argbest(m.tps), argbest([p.tps for p in model])
    slope = verify_slope(ks, m.verify_ratios)
    if bm is None:
        return Diagnosis(None, None, False, model, slope, verify_kind(slope), [], [Verdict(Kind.EMPTY, "no measurements")])
    c = m.speedup[bm]
    if c.ratio is None:  # no pairs to take a ratio of: fall back on the medians, no interval
        c = Comparison(m.tps[bm] / m.baseline_tps if m.baseline_tps else math.nan, None, 0)
    best = Optimum(ks[bm], m.tps[bm], c.ratio, c.interval, tied_with_best(ks, bm, m.paired_tps))
    pred = Optimum(ks[bp], model[bp].tps, model[bp].speedup) if bp is not None else None
    pays = c.kind is Kind.FASTER
    lines = [_headline(best, c, m.baseline_tps)] + ([_ties_line(best)] if best.indistinguishable else [])
    if pred is not None:
        lines.append(_prediction_line(pred, best.k))
    causes = _causes(m, bm, model[bm], c, slope)
    lines += [Verdict(Kind.NOTE, f"note: {x.message}") if pays else Verdict(Kind.CAUSE, f"why: {x.message}")
              for x in causes]
    return Diagnosis(best, pred, pays, model, slope, verify_kind(slope), causes, lines)
