"""``mlxspec sweep``: wall-clock throughput for every K, the optimum, and why speculation loses.

For each K in the sweep, on the same prompts as target-only decoding (measured in the same run,
the method order rotating prompt by prompt to cancel drift), after warm-up:

* tokens/s END-TO-END (generated tokens / (prefill + decode) seconds, as ``bench.spec_bench``),
  median over runs with min and max; decode-only tokens/s too;
* speedup = median over (prompt, repeat) pairs of speculative tps / target-only tps, with a
  bootstrap 95% interval over those pairs (``verdict``);
* acceptance per draft position, *conditional*: a_i = P(draft i accepted | drafts 1..i-1 were),
  over the steps that reached position i with room to draft it (the engine reports the room
  it allowed in every ``Step``). A drafter that proposes fewer than K tokens (prompt lookup
  without a match) counts as a rejection there: nothing to accept. So 1 + sum_j prod_{i<=j} a_i
  is the measured tokens per step. ``draft_coverage`` says how often the drafter proposed a
  token at each position at all;
* draft ms per drafted token (the engine's ``Step.draft_ms`` summed over drafted tokens);
* the verification parallelism, measured directly: one target forward over K+1 tokens on a
  warmed cache (the first prompt prefilled), cache trimmed back after every pass, median of
  ``verify_reps``, divided by the same for one token. Flat (~1x) = batch-parallel; ~K+1 = the
  backend verifies token by token.

Cost model (Leviathan et al. 2023) from the measured numbers: E(K) = 1 + sum_{j<=K} prod_{i<=j}
a_i tokens per step, T(K) = K c_draft + c_verify(K) ms per step, predicted tokens/s E/T against
target-only 1/c_verify(0 drafts) = 1/c_target. Its optimum is reported next to the measured one.

Verdict: the measured optimum K and whether speculation pays there: faster or slower only when
the 95% interval of its paired speedup excludes 1.0, otherwise "no measurable difference"; the
Ks whose paired tokens/s cannot be told apart from the best K's are named. For a loss, the
causes in plain words (thresholds below): a draft too slow to pay, a backend that verifies
serially, too low acceptance, or per-step overhead the cost model does not see.

Auto (on unless ``auto=False``): one more method, ``--k auto``, timed on the same prompts,
repeats and rotation as the fixed Ks, each run with a fresh ``AutoK`` (``Session``:
this machine's cached verify-cost curve, K chosen per step in 0..8). Its row (``KRow.k`` None,
``label`` "auto") has the same measurements, ``mean_k`` the mean K it allowed per step; it has
no cost-model prediction and takes no part in the cost model's optimum. It is compared paired
with the best fixed K (``SweepResult.auto_vs_best``): one verdict line says whether auto beats
it, cannot be told from it (the row marked ≈) or is slower; beating it marks the auto row ★.
``optimum_measured`` and ``pays`` stay about the fixed Ks.

Trees (``trees``: shapes such as 3x2 or auto): one more method per shape, timed like auto on
the same prompts and rotation; each row (``KRow.tree``) is compared paired with the best fixed K
(``SweepResult.trees_vs_best``), and a verdict line names the fastest shape and whether it beats
the best chain. Like auto they take no part in the cost model or ``optimum_measured``.

The result is a ``SweepResult`` record; its ``to_json()`` is the JSON (schema 2, see ``runs``).
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mlxspec.core.drafters import MAX_K
from mlxspec.errors import MlxspecError
from mlxspec.session import Session
from mlxspec.targets.costcurve import time_verify
from mlxspec.measure.runs import (
    SCHEMA,
    WARMUP_TOKENS,
    Run,
    RunHeader,
    acceptance_by_position,
    engine_run,
    first_mismatch,
    fmt,
    fmt_list,
    prepare_speculative_run,
    prepared_prompts,
    progress_ticker,
    run_header,
    spec_bench_prompts,
)
from mlxspec.measure.verdict import (
    Comparison,
    Interval,
    Kind,
    Verdict,
    markup,
    median_ratio,
)

# A draft that costs at least this fraction of a target token per drafted token cannot pay:
# at 0.5x every position must be accepted more than half the time just to break even.
DRAFT_TOO_SLOW = 0.5
# Extra verify cost per extra draft token, in target-token times (least-squares slope of
# cost(K+1)/cost(1) - 1 against K). 0 = perfectly batch-parallel, 1 = fully serial.
SERIAL_SLOPE = 0.5
PARTLY_SERIAL_SLOPE = 0.2
# First-position acceptance below this is "too low" whatever the costs.
LOW_ACCEPTANCE = 0.4
VERIFY_REPS = 7

_RANGE = re.compile(r"^(-?\d+)\s*\.\.\s*(-?\d+)$")
_INT = re.compile(r"^-?\d+$")


# ----------------------------------------------------------------------------- parsing


def parse_ks(text: str) -> list[int]:
    """``"1..8"``, ``"1,2,4,8"``, ``"1..3,8"`` -> sorted distinct Ks, each in 1..MAX_K."""
    if text is None or not str(text).strip():
        raise MlxspecError("no K values given: expected e.g. 1..8 or 1,2,4,8")
    text = str(text)
    ks: set[int] = set()
    for part in text.split(","):
        ks.update(_parse_k_item(part.strip(), text))
    return sorted(ks)


def _parse_k_item(part: str, text: str) -> range:
    if not part:
        raise MlxspecError(f"bad K list {text!r}: empty item (expected e.g. 1..8 or 1,2,4,8)")
    m = _RANGE.match(part)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        for v in (lo, hi):
            _check_k(v, text)
        if lo > hi:
            raise MlxspecError(f"bad K range {part!r} in {text!r}: it runs backwards (write {hi}..{lo})")
        return range(lo, hi + 1)
    if _INT.match(part):
        _check_k(int(part), text)
        return range(int(part), int(part) + 1)
    raise MlxspecError(f"bad K value {part!r} in {text!r}: expected an integer or a range "
                       f"like 1..8 (e.g. 1..8, 1,2,4,8 or 1..3,8)")


def _check_k(v: int, text: str) -> None:
    if not 1 <= v <= MAX_K:
        raise MlxspecError(f"K must be in 1..{MAX_K}, got {v} (in {text!r})")


# ----------------------------------------------------------------------------- the cost model


def expected_tokens(acceptance: Sequence[float | None], k: int) -> float:
    """E(K) = 1 + sum_{j=1..K} prod_{i<=j} a_i: tokens committed per step (the target's own
    token included). A position never reached (None) counts as never accepted."""
    total, run = 1.0, 1.0
    for i in range(k):
        a = acceptance[i] if i < len(acceptance) else None
        run *= 0.0 if a is None else a
        total += run
    return total


def step_ms(k: int, draft_ms_per_token: float, verify_ms: float) -> float:
    """T(K) = K c_draft + c_verify(K)."""
    return k * draft_ms_per_token + verify_ms


def predicted_tps(acceptance: Sequence[float | None], k: int, draft_ms_per_token: float, verify_ms: float) -> float:
    """Predicted tokens/s E(K) / T(K), T in milliseconds."""
    t = step_ms(k, draft_ms_per_token, verify_ms)
    return 1e3 * expected_tokens(acceptance, k) / t if t > 0 else math.inf


def verify_slope(ks: Sequence[int], ratios: Sequence[float]) -> float:
    """Least-squares slope s of cost(K+1)/cost(1) - 1 = s K (through the origin): the extra
    cost of each extra verified token, in one-token passes. 0 = flat, 1 = serial."""
    den = sum(k * k for k in ks)
    return sum(k * (r - 1.0) for k, r in zip(ks, ratios)) / den if den else 0.0


def verify_kind(slope: float) -> str:
    if slope >= SERIAL_SLOPE:
        return "serial"
    if slope >= PARTLY_SERIAL_SLOPE:
        return "partly serial"
    return "batch-parallel"


@dataclass(frozen=True)
class Prediction:
    """The cost model at one K: tokens per step, ms per step, tokens/s, speedup over target-only."""

    k: int
    expected_tokens: float
    step_ms: float
    tps: float
    speedup: float


def cost_model(ks: Sequence[int], acceptance: Sequence[Sequence[float | None]], draft_ms_per_token: Sequence[float],
               verify_ms: Sequence[float], target_ms: float) -> list[Prediction]:
    """Per K (parallel lists): the ``Prediction`` against target-only decoding at ``target_ms``
    per token."""
    out = []
    for k, acc, d, v in zip(ks, acceptance, draft_ms_per_token, verify_ms):
        e, t = expected_tokens(acc, k), step_ms(k, d, v)
        tps = 1e3 * e / t if t > 0 else math.inf
        out.append(Prediction(k, e, t, tps, tps * target_ms / 1e3))
    return out


def argbest(values: Sequence[float | None]) -> int | None:
    """Index of the largest value (the first, so the smallest K, on ties); None if none."""
    best = None
    for i, v in enumerate(values):
        if v is not None and not math.isnan(v) and (best is None or v > values[best]):
            best = i
    return best


def tied_with_best(ks: Sequence[int], best: int, paired_tps: Sequence[Sequence[float]] | None) -> list[int]:
    """The Ks whose tokens/s cannot be told from the best K's: the 95% interval of the median
    paired ratio (same prompt and repeat) includes 1.0. ``paired_tps``: per K, tokens/s of each
    (prompt, repeat) in the same order for every K."""
    if not paired_tps:
        return []
    out = []
    for i, k in enumerate(ks):
        if i != best:
            c = median_ratio([a / b for a, b in zip(paired_tps[i], paired_tps[best]) if b > 0])
            if c.kind is Kind.SAME:
                out.append(k)
    return out


# ----------------------------------------------------------------------------- the diagnosis


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


def diagnose(ks: Sequence[int], tps: Sequence[float], speedup: Sequence[Comparison],
             acceptance: Sequence[Sequence[float | None]], draft_ms_per_token: Sequence[float],
             verify_ms: Sequence[float], target_ms: float, baseline_tps: float | None = None,
             coverage: Sequence[Sequence[float | None]] | None = None,
             paired_tps: Sequence[Sequence[float]] | None = None) -> Diagnosis:
    """The optimum, measured and predicted, and the verdict in words. Pure: numbers in, words out.

    ``tps``: measured median per K; ``speedup``: per K, the paired speedup over target-only with
    its interval; ``acceptance``: conditional per position, per K; ``draft_ms_per_token``,
    ``verify_ms``: per K (verify: one target pass over K+1 tokens); ``target_ms``: one target
    pass over one token; ``coverage`` (optional, per K): how often the drafter proposed a token
    at each position; ``paired_tps`` (optional, per K): tokens/s per (prompt, repeat), to name
    the Ks indistinguishable from the best. Speculation pays iff the best K's speedup interval
    lies above 1.0. Causes of a loss:

    * ``draft_too_slow``: draft ms per token >= DRAFT_TOO_SLOW x target ms per token;
    * ``serial_verify`` / ``partly_serial_verify``: verify cost slope (``verify_slope``) >=
      SERIAL_SLOPE / PARTLY_SERIAL_SLOPE;
    * ``low_acceptance``: first-position acceptance < LOW_ACCEPTANCE at the best K, or no cost
      cause and the cost model also predicts no gain;
    * ``overhead``: none of these, the cost model predicts a gain the run does not see.
    When speculation pays, the cost causes that apply are kept as notes.
    """
    ks = list(ks)
    model = cost_model(ks, acceptance, draft_ms_per_token, verify_ms, target_ms)
    bm, bp = argbest(tps), argbest([m.tps for m in model])
    ratios = [v / target_ms for v in verify_ms] if target_ms > 0 else [math.inf] * len(ks)
    slope = verify_slope(ks, ratios)
    if bm is None:
        return Diagnosis(None, None, False, model, slope, verify_kind(slope), [], [Verdict(Kind.EMPTY, "no measurements")])
    c = speedup[bm]
    if c.ratio is None:  # no pairs to take a ratio of: fall back on the medians, no interval
        c = Comparison(tps[bm] / baseline_tps if baseline_tps else math.nan, None, 0)
    best = Optimum(ks[bm], tps[bm], c.ratio, c.interval, tied_with_best(ks, bm, paired_tps))
    pred = Optimum(ks[bp], model[bp].tps, model[bp].speedup) if bp is not None else None
    pays = c.kind is Kind.FASTER
    lines = [_headline(best, c, baseline_tps)] + ([_ties_line(best)] if best.indistinguishable else [])
    if pred is not None:
        lines.append(_prediction_line(pred, best.k))

    acc = acceptance[bm]
    a1 = acc[0] if acc and acc[0] is not None else 0.0
    won = model[bm].expected_tokens - 1.0  # drafts accepted per step
    causes = _cost_causes(ks, bm, draft_ms_per_token[bm], target_ms, ratios, slope, won)
    if not pays:
        r = draft_ms_per_token[bm] / target_ms if target_ms > 0 else math.inf
        overhead = best.k * r + (ratios[bm] - 1.0)  # extra cost of a step over one target token, in target tokens
        cov1 = coverage[bm][0] if coverage and coverage[bm] and coverage[bm][0] is not None else 1.0
        causes += _loss_causes(best.k, a1, won, overhead, cov1, model[bm].speedup, c.ratio, bool(causes))
    lines += [Verdict(Kind.NOTE, f"note: {x.message}") if pays else Verdict(Kind.CAUSE, f"why: {x.message}")
              for x in causes]
    return Diagnosis(best, pred, pays, model, slope, verify_kind(slope), causes, lines)


# ----------------------------------------------------------------------------- measurements


def position_acceptance(accepted: Sequence[int], drafted: Sequence[int], rooms: Sequence[int],
                        k: int) -> tuple[list[float | None], list[float | None]]:
    """(conditional acceptance a_i, draft coverage) per position i = 0..k-1, over the steps
    that reached i (accepted >= i) with room to draft it. A missing draft is a rejection."""
    acc: list[float | None] = []
    cov: list[float | None] = []
    for i in range(k):
        reached = [(a, d) for a, d, r in zip(accepted, drafted, rooms) if r > i and a >= i]
        acc.append(sum(a > i for a, _ in reached) / len(reached) if reached else None)
        cov.append(sum(d > i for _, d in reached) / len(reached) if reached else None)
    return acc, cov


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class SweepRun:
    """One timed run of the sweep (k = 0: target-only, None: auto), with its ratio to the
    target-only run of the same prompt and repeat and, greedy only, where its tokens first
    differ from it."""

    k: int | str | None  # a string: a tree shape's method (``tree_method``)
    prompt_id: Any
    category: str
    repeat: int
    run: Run
    ratio: float | None = None
    first_mismatch: int | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.run
        return {"k": self.k, "prompt_id": self.prompt_id, "category": self.category, "repeat": self.repeat,
                "tps": r.tps, "decode_tps": r.decode_tps, "generated_tokens": r.generated_tokens,
                "prompt_tokens": r.prompt_tokens, "steps": r.steps, "stop_reason": r.stop_reason, "total_s": r.total_s}


@dataclass(frozen=True)
class Baseline:
    tps: float
    tps_min: float
    tps_max: float
    decode_tps: float | None
    ms_per_token: float | None
    runs: int


@dataclass(frozen=True)
class KRow:
    """Everything measured at one K (None: auto, K chosen per step), then the cost model's
    prediction (none for auto) and the verdict's marks."""

    k: int | None
    runs: int
    tps: float
    tps_min: float
    tps_max: float
    decode_tps: float | None
    comparison: Comparison  # median paired speedup over target-only, with its interval
    speedup_min: float | None
    speedup_max: float | None
    acceptance: list[float | None]
    acceptance_cumulative: list[float | None]
    draft_coverage: list[float | None]
    mean_accepted: float | None
    tokens_per_step: float
    mean_drafted: float | None
    draft_ms_per_token: float
    draft_ms_per_step: float | None
    verify_ms_per_step: float | None
    verify_ms: float | None  # one target pass over K+1 tokens (None for auto)
    verify_ratio: float | None
    greedy_identical: bool | None
    greedy_mismatches: list[Any]
    prediction: Prediction | None = None
    is_optimum: bool = False
    indistinguishable: bool = False  # from the optimum
    mean_k: float | None = None  # mean K the engine allowed per step (auto: the K it chose)
    tree: str | None = None  # a tree shape's row (``k`` None then): its shape, e.g. "3x2"

    @property
    def label(self) -> str:
        return f"tree {self.tree}" if self.tree else "auto" if self.k is None else str(self.k)

    @property
    def speedup(self) -> float | None:
        return self.comparison.ratio

    @property
    def predicted_tps(self) -> float | None:
        return self.prediction and self.prediction.tps

    @property
    def predicted_speedup(self) -> float | None:
        return self.prediction and self.prediction.speedup

    def to_json(self) -> dict[str, Any]:
        iv = self.comparison.interval
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("comparison", "prediction")},
                "label": self.label, "speedup": self.speedup, "verdict": self.comparison.kind.value,
                "interval": None if iv is None else iv.to_json(),
                "expected_tokens": self.prediction and self.prediction.expected_tokens,
                "predicted_tps": self.predicted_tps, "predicted_speedup": self.predicted_speedup}


@dataclass(frozen=True)
class VerifyCost:
    k: int
    tokens: int
    ms: float
    ratio: float
    ms_all: list[float]


@dataclass(frozen=True)
class Verification:
    target_ms: float
    target_ms_all: list[float]
    context_tokens: int
    per_k: list[VerifyCost]
    slope: float
    kind: str


@dataclass(frozen=True)
class SweepSettings:
    ks: list[int]
    draft: str
    temperature: float
    top_p: float
    categories: list[str]
    per_category: int | None
    prompts_file: str | None
    max_tokens: int
    warmup: int
    warmup_tokens: int
    repeats: int
    seed: int
    verify_reps: int
    headline: str = "end-to-end tokens/s = generated tokens / (prefill_s + decode_s), median over runs"
    speedup: str = ("median over (prompt, repeat) pairs of K tokens/s / target-only tokens/s, with a bootstrap 95% "
                    "interval over the pairs")
    acceptance: str = ("conditional per position: P(draft i accepted | drafts before it accepted); a position the "
                       "drafter left empty counts as rejected")
    cost_model: str = ("E(K) = 1 + sum_j prod_{i<=j} a_i; T(K) = K*draft_ms_per_token + verify_ms(K); predicted tps = "
                       "E/T; target-only = 1/verification.target_ms")
    auto_max_k: int | None = None  # the auto row's largest K; None: no auto row
    trees: list[str] = field(default_factory=list)  # tree shapes timed beside the Ks ("3x2", "auto")
    tree_nodes: int | None = None  # --tree-nodes: the cap on every tree


@dataclass(frozen=True)
class SweepResult:
    header: RunHeader
    settings: SweepSettings
    note: str | None
    prompts: list[dict[str, Any]]
    baseline: Baseline
    rows: list[KRow]
    verification: Verification
    diagnosis: Diagnosis
    verdict: list[Verdict]
    runs: list[SweepRun]
    auto: KRow | None = None  # the auto row (not in ``rows``: those are the fixed Ks)
    auto_vs_best: Comparison | None = None  # auto tokens/s over the best fixed K's, paired
    trees: list[KRow] = field(default_factory=list)  # one row per tree shape
    trees_vs_best: list[Comparison | None] = field(default_factory=list)  # each over the best fixed K, paired

    @property
    def all_rows(self) -> list[KRow]:
        """The fixed Ks, then auto if it ran, then the tree shapes."""
        return [*self.rows, *([self.auto] if self.auto else []), *self.trees]

    @property
    def optimum_measured(self) -> Optimum | None:
        return self.diagnosis.optimum_measured

    @property
    def optimum_predicted(self) -> Optimum | None:
        return self.diagnosis.optimum_predicted

    @property
    def pays(self) -> bool:
        return self.diagnosis.pays

    def to_json(self) -> dict[str, Any]:
        d = self.diagnosis
        om, op = d.optimum_measured, d.optimum_predicted
        return {
            "schema": SCHEMA, **self.header.to_json(), "settings": asdict(self.settings), "note": self.note,
            "prompts": self.prompts, "baseline": asdict(self.baseline), "rows": [r.to_json() for r in self.all_rows],
            "verification": asdict(self.verification),
            "optimum_measured": om and om.to_json(),
            "optimum_predicted": op and {"k": op.k, "tps": op.tps, "speedup": op.speedup},
            "pays": d.pays, "causes": [asdict(c) for c in d.causes], "verdict": [v.to_json() for v in self.verdict],
            "runs": [r.to_json() for r in self.runs],
            "auto_vs_best": _comparison_json(self.auto_vs_best, om and om.k),
            "trees_vs_best": [dict(_comparison_json(c, om and om.k) or {}, tree=t.tree)
                              for t, c in zip(self.trees, self.trees_vs_best)],
        }


def _comparison_json(c: Comparison | None, k: int | None) -> dict[str, Any] | None:
    """Auto against the best fixed K ``k``: {k, ratio, verdict, interval}."""
    if c is None:
        return None
    return {"k": k, "ratio": c.ratio, "verdict": c.kind.value,
            "interval": None if c.interval is None else c.interval.to_json()}


# ----------------------------------------------------------------------------- summary of the runs


def baseline_of(runs: Sequence[SweepRun]) -> Baseline:
    tps = [x.run.tps for x in runs]
    return Baseline(statistics.median(tps), min(tps), max(tps),
                    _median([x.run.decode_tps for x in runs if x.run.decode_tps is not None]),
                    _median([v for x in runs for v in x.run.verify_ms]), len(runs))


def k_row(k: int | None, runs: Sequence[SweepRun], verify_ms_all: Sequence[float] | None, target_ms: float,
          greedy: bool) -> KRow:
    """What the runs of one K (None: auto; then positions up to the largest K it chose, the
    mean accepted over every step, and no verify pass of its own) measured: speed, paired
    speedup, acceptance, costs."""
    rs = [x.run for x in runs]
    acc_l = [a for r in rs for a in r.accepted]
    dft_l = [d for r in rs for d in r.drafted]
    room_l = [rm for r in rs for rm in r.rooms]
    depth = max(room_l, default=0) if k is None else k
    acc, cov = position_acceptance(acc_l, dft_l, room_l, depth)
    full = [a for a, rm in zip(acc_l, room_l) if k is None or rm == k]
    dms = [v for r in rs for v in r.draft_ms]
    ratios = [x.ratio for x in runs if x.ratio is not None]
    tps = [r.tps for r in rs]
    mism = [x.prompt_id for x in runs if x.first_mismatch is not None]
    vms = statistics.median(verify_ms_all) if verify_ms_all else None
    return KRow(
        k=k, runs=len(rs), tps=statistics.median(tps), tps_min=min(tps), tps_max=max(tps),
        decode_tps=_median([r.decode_tps for r in rs if r.decode_tps is not None]), comparison=median_ratio(ratios),
        speedup_min=min(ratios, default=None), speedup_max=max(ratios, default=None), acceptance=acc,
        acceptance_cumulative=acceptance_by_position(acc_l, dft_l, depth), draft_coverage=cov,
        mean_accepted=sum(full) / len(full) if full else (sum(acc_l) / len(acc_l) if acc_l else None),
        tokens_per_step=sum(r.generated_tokens for r in rs) / max(1, sum(r.steps for r in rs)),
        mean_drafted=sum(dft_l) / len(dft_l) if dft_l else None, draft_ms_per_token=sum(dms) / max(1, sum(dft_l)),
        draft_ms_per_step=_median(dms), verify_ms_per_step=_median([v for r in rs for v in r.verify_ms]),
        verify_ms=vms, verify_ratio=None if vms is None else vms / target_ms,
        greedy_identical=(not mism) if greedy else None, greedy_mismatches=mism,
        mean_k=sum(room_l) / len(room_l) if room_l else None,
    )


def _paired_tps(ks: Sequence[int | None], runs_by: dict[int | None, list[SweepRun]]) -> list[list[float]]:
    """Per K, tokens/s of each (prompt, repeat) that every K ran, in one order."""
    keys = [(x.prompt_id, x.repeat) for x in runs_by[ks[0]]]
    of = {k: {(x.prompt_id, x.repeat): x.run.tps for x in runs_by[k]} for k in ks}
    keys = [key for key in keys if all(key in of[k] for k in ks)]
    return [[of[k][key] for key in keys] for k in ks]


def _extra_verdicts(rows: Sequence[KRow], best: int | None, headline: Kind) -> list[Verdict]:
    """A best K that wins on some prompts and loses on others; greedy outputs that differ."""
    out = []
    top = next((x for x in rows if x.k == best), None)
    if (top and headline is not Kind.SAME and top.speedup_min is not None
            and top.speedup_min < 1.0 <= top.speedup_max and top.runs > 1):
        out.append(Verdict(Kind.NOTE, f"note: per prompt the speedup at K={best} ranges {top.speedup_min:.2f}x-"
                                      f"{top.speedup_max:.2f}x: it pays on some prompts and loses on others"))
    bad = [f"{x.label if x.k is None else f'K={x.k}'} (prompts {', '.join(map(str, x.greedy_mismatches))})"
           for x in rows if x.greedy_mismatches]
    if bad:
        out.append(Verdict(Kind.BUG, "BUG: greedy speculative output differs from target-only at " + "; ".join(bad)))
    return out


def _verification(ks: Sequence[int], vt: dict[int, list[float]], target_ms: float, context_tokens: int,
                  d: Diagnosis) -> Verification:
    per_k = [VerifyCost(k, k + 1, statistics.median(vt[k + 1]), statistics.median(vt[k + 1]) / target_ms, vt[k + 1])
             for k in ks]
    return Verification(target_ms, vt[1], context_tokens, per_k, d.verify_slope, d.verify_kind)


def summarise(ks: Sequence[int], runs_by: dict[int | None, list[SweepRun]], verify_times: dict[int, list[float]],
              context_tokens: int, header: RunHeader, settings: SweepSettings, note: str | None,
              prompts: list[dict[str, Any]]) -> SweepResult:
    """The sweep's result from its timed runs (``runs_by[0]``: target-only; ``runs_by[None]``,
    if present: auto) and verify times ({tokens in the pass: [ms]}). Pure: the demo and the
    tests feed it scripted runs."""
    target_ms = statistics.median(verify_times[1])
    baseline = baseline_of(runs_by[0])
    rows = [k_row(k, runs_by[k], verify_times[k + 1], target_ms, settings.temperature == 0) for k in ks]
    d = diagnose(ks, [x.tps for x in rows], [x.comparison for x in rows], [x.acceptance for x in rows],
                 [x.draft_ms_per_token for x in rows], [x.verify_ms for x in rows], target_ms, baseline.tps,
                 coverage=[x.draft_coverage for x in rows], paired_tps=_paired_tps(ks, runs_by))
    om = d.optimum_measured
    best = om.k if om else None
    rows = [replace(x, prediction=p, is_optimum=x.k == best, indistinguishable=bool(om and x.k in om.indistinguishable))
            for x, p in zip(rows, d.predicted)]
    auto, vs_best = _auto_row(runs_by, best, target_ms, settings.temperature == 0)
    verdict = list(d.verdict)
    if om and auto and vs_best:  # after the headline (and its ties), before the cost model and the causes
        at = 1 + bool(om.indistinguishable)
        verdict[at:at] = [_auto_line(auto, vs_best, om.k)]
    trees, trees_vs = _tree_rows(runs_by, settings.trees, best, target_ms, settings.temperature == 0)
    if om and trees:
        at = 1 + bool(om.indistinguishable) + bool(auto and vs_best)
        verdict[at:at] = _tree_lines(trees, trees_vs, om.k)
    verdict += _extra_verdicts([*rows, *([auto] if auto else []), *trees], best, d.verdict[0].kind)
    methods = [0, *ks, *([None] if auto else []), *map(tree_method, settings.trees)]
    return SweepResult(header, settings, note, prompts, baseline, rows,
                       _verification(ks, verify_times, target_ms, context_tokens, d), d, verdict,
                       [x for m in methods for x in runs_by[m]], auto, vs_best, trees, trees_vs)


def tree_method(shape: str) -> str:
    """The method key of a tree shape's runs ("tree 3x2"): a string, unlike the Ks."""
    return f"tree {shape}"


def _tree_rows(runs_by: dict[Any, list[SweepRun]], shapes: Sequence[str], best: int | None, target_ms: float,
               greedy: bool) -> tuple[list[KRow], list[Comparison | None]]:
    """A row per tree shape that ran, and its paired tokens/s over the best fixed K's (★
    measurably faster, ≈ no measurable difference), as ``_auto_row``."""
    rows, vs = [], []
    for shape in shapes:
        m = tree_method(shape)
        row = replace(k_row(None, runs_by[m], None, target_ms, greedy), tree=shape)
        c = None
        if best is not None:
            tree_tps, best_tps = _paired_tps([m, best], runs_by)
            c = median_ratio([a / b for a, b in zip(tree_tps, best_tps) if b > 0])
            row = replace(row, is_optimum=c.kind is Kind.FASTER, indistinguishable=c.kind is Kind.SAME)
        rows.append(row)
        vs.append(c)
    return rows, vs


def _tree_lines(rows: Sequence[KRow], vs: Sequence[Comparison | None], k: int) -> list[Verdict]:
    """The fastest tree shape (by median tokens/s), against the best fixed K = ``k``."""
    i = max(range(len(rows)), key=lambda j: rows[j].tps)
    row, c = rows[i], vs[i]
    own = (f"fastest tree: {row.tree} ({row.tps:.1f} tok/s, {fmt(row.speedup, '{:.2f}x')} target-only, "
           f"{fmt(row.mean_accepted, '{:.2f}')} accepted per step)")
    if c is None or c.kind not in (Kind.FASTER, Kind.SLOWER, Kind.SAME):
        return [Verdict(Kind.INFO, f"{own}; no paired runs to compare it with the best fixed K = {k}")]
    word = {Kind.FASTER: "faster than", Kind.SLOWER: "slower than", Kind.SAME: "tied with"}[c.kind]
    advice = {Kind.FASTER: f"; --tree {row.tree} beats any chain here", Kind.SLOWER: f"; a chain (--k {k}) is faster here",
              Kind.SAME: "; no measurable difference"}[c.kind]
    return [Verdict(c.kind, f"{own} — {word} the best fixed K = {k}: {c.ratio:.2f}x its tokens/s "
                            f"({c.describe()}){advice}", c.interval)]


def _auto_row(runs_by: dict[int | None, list[SweepRun]], best: int | None, target_ms: float,
              greedy: bool) -> tuple[KRow | None, Comparison | None]:
    """The auto row (``runs_by[None]``), if it ran, and its paired tokens/s over the best fixed
    K's: measurably faster marks it ★ (``is_optimum``), no measurable difference ≈."""
    if not runs_by.get(None):
        return None, None
    row = k_row(None, runs_by[None], None, target_ms, greedy)
    if best is None:
        return row, None
    auto_tps, best_tps = _paired_tps([None, best], runs_by)
    c = median_ratio([a / b for a, b in zip(auto_tps, best_tps) if b > 0])
    return replace(row, is_optimum=c.kind is Kind.FASTER, indistinguishable=c.kind is Kind.SAME), c


def _auto_line(row: KRow, c: Comparison, k: int) -> Verdict:
    """Auto against the best fixed K = ``k``, in words, of the kind of that comparison."""
    sp = row.comparison
    own = (f"auto (K per step, mean {fmt(row.mean_k, '{:.1f}')}) reaches {fmt(sp.ratio, '{:.2f}x')} target-only "
           f"({row.tps:.1f} tok/s; {sp.describe()})")
    if c.kind is Kind.FASTER:
        return Verdict(c.kind, f"{own} — faster than the best fixed K = {k}: {c.ratio:.2f}x its tokens/s "
                               f"({c.describe()})", c.interval)
    if c.kind is Kind.SLOWER:
        return Verdict(c.kind, f"{own} — slower than the best fixed K = {k}: {c.ratio:.2f}x its tokens/s "
                               f"({c.describe()}); a fixed --k {k} is faster here", c.interval)
    if c.kind is Kind.SAME:
        return Verdict(c.kind, f"{own} — tied with the best fixed K = {k}: {c.ratio:.2f}x its tokens/s, no "
                               f"measurable difference ({c.describe()}); auto does as well without choosing K",
                       c.interval)
    return Verdict(Kind.INFO, f"{own}; no paired runs to compare it with the best fixed K = {k}")


# ----------------------------------------------------------------------------- the sweep


def _check_sweep_args(ks: Sequence[int] | str, max_tokens: int, warmup: int, repeats: int,
                      verify_reps: int) -> list[int]:
    if isinstance(ks, str):
        ks = parse_ks(ks)
    ks = sorted({int(k) for k in ks})
    if not ks:
        raise MlxspecError("no K values to sweep")
    for k in ks:
        _check_k(k, ",".join(map(str, ks)))
    if max_tokens < 2:
        raise MlxspecError(f"max_tokens must be >= 2 to time decoding, got {max_tokens}")
    if repeats < 1 or warmup < 0:
        raise MlxspecError("repeats must be >= 1 and warmup >= 0")
    if verify_reps < 1:
        raise MlxspecError(f"verify_reps must be >= 1, got {verify_reps}")
    return ks


def _label(m: int | str | None) -> str:
    return "target-only" if m == 0 else "auto" if m is None else m if isinstance(m, str) else f"K={m}"


def _sweep_round(run: Callable[[int | None, list[int]], Run], methods: list[int | None], rot: int,
                 it: dict[str, Any], p: list[int], r: int, greedy: bool,
                 report: Callable[[int | None, Run], None]) -> dict[int | None, SweepRun]:
    """Every method once on one prompt, the order rotated by ``rot``; ratios to target-only."""
    got: dict[int | None, Run] = {}
    for m in methods[rot:] + methods[:rot]:
        got[m] = run(m, p)
        report(m, got[m])
    base = got[0]
    return {m: SweepRun(m, it["id"], it["category"], r, x,
                        ratio=(x.tps / base.tps if base.tps > 0 else None) if m != 0 else None,
                        first_mismatch=first_mismatch(base.tokens, x.tokens) if m != 0 and greedy else None)
            for m, x in got.items()}


def _time_sweep_runs(run: Callable[[int | None, list[int]], Run], methods: list[int | None],
                     items: list[dict[str, Any]], ids: list[list[int]], repeats: int, greedy: bool,
                     tick: Callable[[str], None],
                     on_run: Callable[[dict[str, Any]], Any] | None) -> dict[int | None, list[SweepRun]]:
    """Every (repeat, prompt) round, the method order rotating round by round to spread drift."""
    runs_by: dict[int | None, list[SweepRun]] = {m: [] for m in methods}
    done = {m: 0 for m in methods}
    rnd = 0
    for r in range(repeats):
        for it, p in zip(items, ids):

            def report(m: int | None, x: Run, it: dict[str, Any] = it, r: int = r) -> None:
                done[m] += 1
                if on_run is not None:
                    on_run({"k": m, "prompt_id": it["id"], "category": it["category"], "repeat": r, "tps": x.tps,
                            "accepted": list(x.accepted), "drafted": list(x.drafted), "rooms": list(x.rooms),
                            "done": done[m], "of": repeats * len(items)})
                tick(f"{_label(m)} · {it['category']} #{it['id']} · repeat {r + 1}/{repeats}")

            got = _sweep_round(run, methods, rnd % len(methods), it, p, r, greedy, report)
            rnd += 1
            for m in methods:
                runs_by[m].append(got[m])
    return runs_by


def run_sweep(
    ks: Sequence[int] | str,
    model_spec: Any = "default",
    draft: str = "ngram:3",
    temp: float = 0.0,
    top_p: float = 1.0,
    prompts_file: str | Path | None = None,
    per_category: int = 1,
    categories: Sequence[str] | None = None,
    max_tokens: int = 48,
    warmup: int = 1,
    repeats: int = 1,
    seed: int = 0,
    dtype: str = "auto",
    progress: Callable[[int, int, str], Any] | None = None,
    verify_reps: int = VERIFY_REPS,
    on_run: Callable[[dict[str, Any]], Any] | None = None,
    auto: bool = True,
    remeasure_cost: bool = False,
    trees: Sequence[Any] = (),
) -> SweepResult:
    """Sweep K for ``draft`` on ``model_spec`` (a ``loading.load`` spec or a loaded model).

    Prompts: ``runs.spec_bench_prompts(categories, per_category, prompts_file)`` (default: the
    first question of each of the six Spec-Bench subtasks). ``progress(done, total, label)``.
    ``on_run(run)`` after every timed run, for live displays: plain values {k (0 = target-only,
    None = auto), prompt_id, category, repeat, tps, accepted, drafted, rooms (per step), done, of
    (runs of this K)}. ``auto``: time ``--k auto`` too, a fresh ``AutoK`` per run on this
    machine's verify-cost curve (measured first if not cached, or with ``remeasure_cost``).
    JSON keys (``to_json``): schema, date, machine, backend, blas, mlx_version, mlx_lm_version,
    model, dtype, settings, note, prompts, baseline{tps, tps_min, tps_max, decode_tps,
    ms_per_token, runs}, rows[per K: k, tps, tps_min, tps_max, decode_tps, speedup, verdict,
    interval, speedup_min, speedup_max, acceptance, acceptance_cumulative, draft_coverage,
    mean_accepted, tokens_per_step, mean_drafted, draft_ms_per_token, draft_ms_per_step,
    verify_ms_per_step, verify_ms, verify_ratio, expected_tokens, predicted_tps,
    predicted_speedup, greedy_identical, is_optimum, indistinguishable, mean_k, label; the auto
    row last, k null, label "auto"], verification{target_ms,
    per_k[{k, tokens, ms, ratio, ms_all}], slope, kind}, optimum_measured{k, tps, speedup,
    interval, indistinguishable}, optimum_predicted{k, tps, speedup}, pays, causes[{cause,
    message}], verdict[{kind, text, interval}], runs[compact per-run rows], auto_vs_best{k, ratio,
    verdict, interval} (auto's paired tokens/s over the best fixed K's; null without auto).
    ``trees``: ``TreeShape``s timed too, a row each after auto (k null, tree and label "tree
    SHAPE"), and trees_vs_best[{tree, k, ratio, verdict, interval}].
    """
    from mlxspec.core.sampling import SamplingParams

    ks = _check_sweep_args(ks, max_tokens, warmup, repeats, verify_reps)
    params = SamplingParams(temperature=float(temp), top_p=float(top_p))
    items, note = spec_bench_prompts(list(categories) if categories else None, per_category, prompts_file)
    lm, drafter, stop, ids = prepare_speculative_run(
        model_spec, draft, dtype, items, max_tokens,
        no_drafter="a sweep needs a drafter (got 'none'): e.g. --draft ngram:3 or self:8")

    from mlxspec.core.drafters import can_branch

    if trees and not can_branch(drafter):
        raise MlxspecError(f"drafter {draft!r} cannot branch: --tree needs a draft model, self:L, an eagle head or ngram:N")
    shapes = {tree_method(str(t)): t for t in trees}
    # 0 = target-only, None = auto, "tree SHAPE" = a tree
    methods: list[int | str | None] = [0, *ks, *([None] if auto else []), *shapes]
    sizes = sorted({1} | {k + 1 for k in ks})
    total = warmup * len(methods) + verify_reps + repeats * len(items) * len(methods)
    say = (lambda text: progress(0, total, text)) if progress is not None else None
    session = Session(lm, remeasure_cost=remeasure_cost, log=say)
    policy = session.use(drafter, "auto").policy if auto else None
    shapes = {m: session.priced(t) for m, t in shapes.items()}
    tick = progress_ticker(progress, total)

    def run(m: int | str | None, p: list[int], n: int = max_tokens) -> Run:
        if isinstance(m, str):
            return engine_run(lm, p, params, n, stop, seed, drafter, shapes[m].depth, tree=shapes[m])
        # auto: a fresh policy every run (the template never drafts, so nothing carries over)
        k = policy.fresh() if m is None else m or 1
        return engine_run(lm, p, params, n, stop, seed, drafter if m != 0 else None, k)

    for w in range(warmup):
        for m in methods:
            run(m, ids[0], min(max_tokens, WARMUP_TOKENS))
            tick(f"warm-up {w + 1}/{warmup} · {_label(m)}")
    vt = time_verify(lm.model, ids[0], sizes, verify_reps,
                     progress=lambda r: tick(f"verify cost · {r}/{verify_reps} rounds over {len(sizes)} sizes"))
    runs_by = _time_sweep_runs(run, methods, items, ids, repeats, params.greedy, tick, on_run)
    settings = SweepSettings(ks, draft, float(temp), float(top_p), list(dict.fromkeys(it["category"] for it in items)),
                             per_category if prompts_file is None else None,
                             str(prompts_file) if prompts_file is not None else None, max_tokens, warmup,
                             min(max_tokens, WARMUP_TOKENS), repeats, seed, verify_reps,
                             auto_max_k=policy.max_k if policy is not None else None,
                             trees=[str(t) for t in trees],
                             tree_nodes=next((t.max_nodes for t in trees), None))
    return summarise(ks, runs_by, vt, len(ids[0]), run_header(lm), settings, note, prepared_prompts(items, ids))


# ----------------------------------------------------------------------------- output


def _speedup_cell(row: KRow) -> str:
    sp = fmt(row.speedup, "{:.2f}x")
    return markup(row.comparison.kind, sp) if row.comparison.kind in (Kind.FASTER, Kind.SLOWER) else sp


def _k_cell(row: KRow) -> str:
    name = (row.label if row.tree else f"auto ({fmt(row.mean_k, '{:.1f}')})" if row.k is None else str(row.k))
    return f"{name} ★" if row.is_optimum else f"{name} ≈" if row.indistinguishable else name


def _sweep_table(result: SweepResult):
    from rich.table import Table

    s, b, v, h = result.settings, result.baseline, result.verification, result.header
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}, top-p={s.top_p:g}"
    table = Table(
        title=f"K sweep: {h.model} ({h.dtype}) + {s.draft}, {temp} — {h.backend}",
        caption=(f"{len(result.prompts)} prompts x {s.repeats} repeat(s), {s.max_tokens} new tokens max, "
                 f"{s.warmup} warm-up; tok/s end-to-end, median \\[min-max] over runs; speedup: median per prompt, "
                 f"95% interval: bootstrap over (prompt, repeat) pairs; ★ best K, ≈ indistinguishable from it; "
                 f"acc: conditional acceptance by draft position; verify x1: one target pass over K+1 tokens / "
                 f"one token (median of {s.verify_reps}); pred: cost model"
                 + ("; auto: K chosen per step (its mean in brackets), ★ if measurably faster than the best K, ≈ if "
                    "not measurably different" if result.auto else "")),
    )
    for col, just in (("K", "right"), ("tok/s", "right"), ("min-max", "right"), ("speedup", "right"),
                      ("95% interval", "right"), ("acc by position", "left"), ("accepted/step", "right"),
                      ("draft ms/tok", "right"), ("verify ms/step", "right"), ("verify x1", "right"),
                      ("pred tok/s", "right"), ("pred speedup", "right")):
        table.add_column(col, justify=just)
    table.add_row("target", fmt(b.tps), f"{fmt(b.tps_min)}-{fmt(b.tps_max)}", "1.00x", "", "", "", "",
                  fmt(b.ms_per_token, "{:.1f}"), "1.00x", fmt(1e3 / v.target_ms if v.target_ms else None),
                  "1.00x", style="dim", end_section=True)
    best_p = result.optimum_predicted.k if result.optimum_predicted else None
    for row in result.all_rows:
        iv = row.comparison.interval
        table.add_row(
            _k_cell(row), fmt(row.tps), f"{fmt(row.tps_min)}-{fmt(row.tps_max)}", _speedup_cell(row),
            "-" if iv is None else str(iv), fmt_list(row.acceptance), fmt(row.mean_accepted, "{:.2f}"),
            fmt(row.draft_ms_per_token, "{:.2f}"), fmt(row.verify_ms_per_step), fmt(row.verify_ratio, "{:.2f}x"),
            fmt(row.predicted_tps) + (" ◆" if row.k == best_p else ""), fmt(row.predicted_speedup, "{:.2f}x"),
            style="bold green" if row.is_optimum and result.pays else "bold" if row.is_optimum else None,
            end_section=(row is result.rows[-1] and (result.auto is not None or bool(result.trees))
                         or row is result.auto and bool(result.trees)),
        )
    return table


def print_sweep(result: SweepResult, console) -> None:
    """A rich table (target-only, then one row per K and auto, the optimum starred), the verification
    parallelism and the verdict, each line coloured by its kind."""
    console.print(_sweep_table(result))
    v = result.verification
    per = ", ".join(f"K+1={p.tokens}: {p.ratio:.2f}x" for p in v.per_k)
    console.print(f"verification parallelism: one target token {v.target_ms:.1f} ms; {per} -> "
                  f"[bold]{v.kind}[/] (+{v.slope:.2f} token-times per extra draft; flat = 0, serial = 1)",
                  highlight=False)
    if result.note:
        console.print(f"[yellow]note:[/] {result.note}")
    for line in result.verdict:
        console.print(markup(line.kind, line.text), highlight=False)


CSV_FIELDS = ("k", "tps", "tps_min", "tps_max", "decode_tps", "speedup", "speedup_min", "speedup_max",
              "mean_accepted", "tokens_per_step", "mean_drafted", "draft_ms_per_token", "draft_ms_per_step",
              "verify_ms_per_step", "verify_ms", "verify_ratio", "expected_tokens", "predicted_tps",
              "predicted_speedup", "is_optimum", "baseline_tps", "mean_k")


def write_csv(result: SweepResult, path: str | Path) -> Path:
    """One row per K, then auto (k "auto"): the scalar columns ``CSV_FIELDS`` then
    acc_1..acc_maxK (conditional acceptance by position; empty beyond K or where no step
    reached it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kmax = max((len(r.acceptance) for r in result.all_rows), default=0)
    acc_cols = [f"acc_{i + 1}" for i in range(kmax)]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([*CSV_FIELDS, *acc_cols])
        for r in result.all_rows:
            vals = {**r.to_json(), "k": r.label, "baseline_tps": result.baseline.tps}
            acc = list(r.acceptance) + [None] * (kmax - len(r.acceptance))
            w.writerow([("" if vals.get(c) is None else vals[c]) for c in CSV_FIELDS]
                       + ["" if a is None else a for a in acc])
    return path


def _plot_throughput(ax, result: SweepResult) -> None:
    rows, b = result.rows, result.baseline
    ks = [r.k for r in rows]
    ax.errorbar(ks, [r.tps for r in rows], yerr=[[r.tps - r.tps_min for r in rows], [r.tps_max - r.tps for r in rows]],
                marker="o", capsize=3, color="tab:blue", label="speculative, measured (median, min-max over runs)")
    ax.plot(ks, [r.predicted_tps for r in rows], "--", marker="s", markersize=4, color="tab:purple",
            alpha=0.8, label="cost model prediction")
    ax.axhline(b.tps, color="tab:gray", linestyle="-", linewidth=1.5, label=f"target-only ({b.tps:.1f} tok/s)")
    ax.axhspan(b.tps_min, b.tps_max, color="tab:gray", alpha=0.12)
    a = result.auto
    if a is not None and a.mean_k is not None:  # at the mean K it chose
        mark = " ★" if a.is_optimum else " ≈" if a.indistinguishable else ""
        ax.errorbar([a.mean_k], [a.tps], yerr=[[a.tps - a.tps_min], [a.tps_max - a.tps]], marker="P", markersize=10,
                    capsize=3, color="tab:cyan", markeredgecolor="black", linestyle="none", zorder=6,
                    label=f"auto{mark}: K per step, mean {a.mean_k:.1f} ({fmt(a.speedup, '{:.2f}x')})")
    om, op = result.optimum_measured, result.optimum_predicted
    if om:
        ax.plot([om.k], [om.tps], marker="*", markersize=18, color="gold", markeredgecolor="black",
                linestyle="none", label=f"measured optimum K={om.k} ({om.speedup:.2f}x)", zorder=5)
    if op:
        ax.plot([op.k], [op.tps], marker="D", markersize=8, color="none", markeredgecolor="tab:purple",
                linestyle="none", label=f"predicted optimum K={op.k} ({op.speedup:.2f}x)", zorder=5)
    ax.set_xlabel("K (draft tokens per step)")
    ax.set_ylabel("tokens/s (end-to-end)")
    ax.set_title("throughput")
    ax.set_xticks(ks)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _plot_acceptance(ax, result: SweepResult) -> None:
    rows = result.rows
    ks = [r.k for r in rows]
    first = [r.acceptance[0] if r.acceptance and r.acceptance[0] is not None else float("nan") for r in rows]
    ax.plot(ks, first, marker="o", color="tab:green", label="acceptance at position 1")
    ax.plot(ks, [(r.mean_accepted or 0.0) / r.k for r in rows], marker="o", color="tab:olive",
            label="accepted drafts / K")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("K")
    ax.set_ylabel("acceptance rate")
    ax.set_title("acceptance")
    ax.set_xticks(ks)
    ax.grid(alpha=0.3)
    tw = ax.twinx()
    tw.plot(ks, [r.mean_accepted or 0.0 for r in rows], marker="^", linestyle=":", color="tab:red",
            label="mean accepted length")
    a = result.auto
    if a is not None and a.mean_k is not None and a.acceptance and a.acceptance[0] is not None:
        ax.plot([a.mean_k], [a.acceptance[0]], marker="P", markersize=10, color="tab:cyan", markeredgecolor="black",
                linestyle="none", label=f"auto: position 1, at its mean K {a.mean_k:.1f}")
    tw.set_ylabel("accepted drafts per step", color="tab:red")
    tw.set_ylim(0, max(1.0, 1.15 * max([r.mean_accepted or 0.0 for r in rows], default=0.0)))
    if result.optimum_measured:
        ax.axvline(result.optimum_measured.k, color="gold", linewidth=2, alpha=0.6)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")


def _plot_verification(ax, result: SweepResult) -> None:
    v = result.verification
    ks = [r.k for r in result.rows]
    ax.plot(ks, [p.ratio for p in v.per_k], marker="o", color="tab:orange",
            label="measured: pass over K+1 tokens / 1 token")
    ax.plot(ks, [1.0] * len(ks), "--", color="tab:green", label="flat (batch-parallel)")
    ax.plot(ks, [k + 1 for k in ks], "--", color="tab:red", label="linear (serial)")
    ax.set_xlabel("K")
    ax.set_ylabel("cost relative to one token")
    ax.set_title(f"verification: {v.kind} (+{v.slope:.2f}/token)")
    ax.set_xticks(ks)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def plot_sweep(result: SweepResult, path: str | Path) -> Path:
    """PNG, three panels against K: tokens/s (measured median with min-max bars, the cost model,
    target-only as a horizontal line, the optimum starred, auto as a cross at the mean K it
    chose); acceptance (first position, mean
    over positions, accepted drafts per step); verify cost of K+1 tokens / one token against the
    flat and serial lines. Matplotlib with the Agg canvas (no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise MlxspecError("plotting needs matplotlib: pip install matplotlib") from None

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    s, h = result.settings, result.header
    fig = Figure(figsize=(15, 4.8), dpi=110, layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
    fig.suptitle(f"K sweep: {h.model} ({h.dtype}) + {s.draft}, {temp} — {h.backend}", fontsize=11)
    _plot_throughput(ax1, result)
    _plot_acceptance(ax2, result)
    _plot_verification(ax3, result)
    fig.savefig(path, format="png")
    return path
