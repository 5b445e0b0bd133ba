"""The sweep's cost model (Leviathan et al. 2023) and the thresholds its diagnosis uses: E(K) =
1 + sum_{j<=K} prod_{i<=j} a_i tokens per step, T(K) = K c_draft + c_verify(K) ms per step,
predicted tokens/s E/T against target-only 1/c_target. Pure functions of measured numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlxspec.measure.verdict import Kind, median_ratio

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
