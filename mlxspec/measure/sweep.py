"""``mlxspec sweep``: wall-clock throughput for every K, the optimum, and why speculation loses.

For each K in the sweep, on the same prompts as target-only decoding (measured in the same run,
the method order rotating prompt by prompt to cancel drift), after warm-up:

* tokens/s END-TO-END (generated tokens / (prefill + decode) seconds, as ``bench.spec_bench``),
  median over runs with min and max; decode-only tokens/s too;
* speedup = median over (prompt, repeat) pairs of speculative tps / target-only tps;
* acceptance per draft position, *conditional*: a_i = P(draft i accepted | drafts 1..i-1 were),
  over the steps that reached position i with room to draft it. A drafter that proposes fewer
  than K tokens (prompt lookup without a match) counts as a rejection there: nothing to accept.
  So 1 + sum_j prod_{i<=j} a_i is the measured tokens per step. ``draft_coverage`` says how
  often the drafter proposed a token at each position at all;
* draft ms per drafted token (the engine's ``Step.draft_ms`` summed over drafted tokens);
* the verification parallelism, measured directly: one target forward over K+1 tokens on a
  warmed cache (the first prompt prefilled), cache trimmed back after every pass, median of
  ``verify_reps``, divided by the same for one token. Flat (~1x) = batch-parallel; ~K+1 = the
  backend verifies token by token.

Cost model (Leviathan et al. 2023) from the measured numbers: E(K) = 1 + sum_{j<=K} prod_{i<=j}
a_i tokens per step, T(K) = K c_draft + c_verify(K) ms per step, predicted tokens/s E/T against
target-only 1/c_verify(0 drafts) = 1/c_target. Its optimum is reported next to the measured one.

Verdict: the measured optimum K, whether speculation pays at all, and for a loss the causes in
plain words (thresholds below): a draft too slow to pay, a backend that verifies serially, too
low acceptance, or per-step overhead the cost model does not see.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxspec.core.drafters import MAX_K
from mlxspec.errors import MlxspecError
from mlxspec.measure.bench import (
    WARMUP_TOKENS,
    _acc,
    _f,
    _first_mismatch,
    _mlxspec_run,
    acceptance_by_position,
    prepare_speculative_run,
    run_header,
    spec_bench_prompts,
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
        part = part.strip()
        if not part:
            raise MlxspecError(f"bad K list {text!r}: empty item (expected e.g. 1..8 or 1,2,4,8)")
        m = _RANGE.match(part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            for v in (lo, hi):
                _check_k(v, text)
            if lo > hi:
                raise MlxspecError(f"bad K range {part!r} in {text!r}: it runs backwards (write {hi}..{lo})")
            ks.update(range(lo, hi + 1))
        elif _INT.match(part):
            v = int(part)
            _check_k(v, text)
            ks.add(v)
        else:
            raise MlxspecError(f"bad K value {part!r} in {text!r}: expected an integer or a range "
                               f"like 1..8 (e.g. 1..8, 1,2,4,8 or 1..3,8)")
    return sorted(ks)


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


def cost_model(ks: Sequence[int], acceptance: Sequence[Sequence[float | None]], draft_ms_per_token: Sequence[float],
               verify_ms: Sequence[float], target_ms: float) -> list[dict[str, float]]:
    """Per K (parallel lists): expected tokens per step, step ms, predicted tokens/s and the
    predicted speedup over target-only decoding at ``target_ms`` per token."""
    out = []
    for k, acc, d, v in zip(ks, acceptance, draft_ms_per_token, verify_ms):
        e, t = expected_tokens(acc, k), step_ms(k, d, v)
        tps = 1e3 * e / t if t > 0 else math.inf
        out.append({"k": k, "expected_tokens": e, "step_ms": t, "tps": tps,
                    "speedup": tps * target_ms / 1e3})
    return out


def argbest(values: Sequence[float | None]) -> int | None:
    """Index of the largest value (the first, so the smallest K, on ties); None if none."""
    best = None
    for i, v in enumerate(values):
        if v is not None and not math.isnan(v) and (best is None or v > values[best]):
            best = i
    return best


def _g(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"


def diagnose(ks: Sequence[int], tps: Sequence[float], speedup: Sequence[float],
             acceptance: Sequence[Sequence[float | None]], draft_ms_per_token: Sequence[float],
             verify_ms: Sequence[float], target_ms: float, baseline_tps: float | None = None,
             coverage: Sequence[Sequence[float | None]] | None = None) -> dict[str, Any]:
    """The optimum, measured and predicted, and the verdict in words. Pure: numbers in, words out.

    ``tps``/``speedup``: measured per K; ``acceptance``: conditional per position, per K;
    ``draft_ms_per_token``, ``verify_ms``: per K (verify: one target pass over K+1 tokens);
    ``target_ms``: one target pass over one token; ``coverage`` (optional, per K): how often the
    drafter proposed a token at each position. Causes of a loss (best speedup < 1):

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
    bm = argbest(tps)
    bp = argbest([m["tps"] for m in model])
    ratios = [v / target_ms for v in verify_ms] if target_ms > 0 else [math.inf] * len(ks)
    slope = verify_slope(ks, ratios)
    out: dict[str, Any] = {
        "optimum_measured": None, "optimum_predicted": None, "pays": False, "predicted": model,
        "verify_slope": slope, "verify_kind": verify_kind(slope), "causes": [], "verdict": [],
    }
    if bm is None:
        out["verdict"] = ["no measurements"]
        return out
    k = ks[bm]
    sp = speedup[bm]
    if sp is None:  # no pairs to take a ratio of: fall back on the medians
        sp = tps[bm] / baseline_tps if baseline_tps else math.nan
    pays = sp >= 1.0
    out["optimum_measured"] = {"k": k, "tps": tps[bm], "speedup": sp}
    out["pays"] = pays
    if bp is not None:
        out["optimum_predicted"] = {"k": ks[bp], "tps": model[bp]["tps"], "speedup": model[bp]["speedup"]}
    base = f" ({tps[bm]:.1f} vs {baseline_tps:.1f} tok/s)" if baseline_tps else f" ({tps[bm]:.1f} tok/s)"
    lines = []
    if pays:
        lines.append(f"best K = {k}: {sp:.2f}x target-only{base} — speculation pays here")
    else:
        lines.append(f"speculation does not pay here: the best K = {k} reaches only {sp:.2f}x target-only{base}; "
                     f"decode without a draft")
    if bp is not None:
        p = model[bp]
        agree = "agrees" if ks[bp] == k else f"measured best K = {k}"
        lines.append(f"cost model (measured acceptance and costs) predicts best K = {ks[bp]}: {p['tps']:.1f} tok/s, "
                     f"{p['speedup']:.2f}x — {agree}")

    # causes, judged at the measured best K
    acc = acceptance[bm]
    a1 = acc[0] if acc and acc[0] is not None else 0.0
    won = model[bm]["expected_tokens"] - 1.0  # drafts accepted per step
    r = draft_ms_per_token[bm] / target_ms if target_ms > 0 else math.inf
    v = ratios[bm]
    cov1 = coverage[bm][0] if coverage and coverage[bm] and coverage[bm][0] is not None else 1.0
    overhead = k * r + (v - 1.0)  # extra cost of a step over one target token, in target tokens
    causes: list[dict[str, str]] = []
    if r >= DRAFT_TOO_SLOW:
        causes.append({"cause": "draft_too_slow", "message":
                       f"draft costs {_g(r)}x the target — too slow to pay ({draft_ms_per_token[bm]:.1f} ms per "
                       f"draft token vs {target_ms:.1f} ms per target token; at K={k} drafting costs {k * r:.2f} "
                       f"target tokens per step and wins {won:.2f})"})
    kv = verify_kind(slope)
    top = max(range(len(ks)), key=lambda i: ks[i])  # the largest K: where serial verification shows most
    if kv == "serial":
        causes.append({"cause": "serial_verify", "message":
                       f"verify cost grows ~linearly with K — this backend verifies serially (a pass over K+1 = "
                       f"{ks[top] + 1} tokens costs {ratios[top]:.1f}x one token; batch-parallel would stay near "
                       f"1x; +{slope:.2f} of a token per extra draft)"})
    elif kv == "partly serial":
        causes.append({"cause": "partly_serial_verify", "message":
                       f"verify cost grows with K — verification is only partly batch-parallel here (+{slope:.2f} "
                       f"of a token per extra draft; a pass over {ks[top] + 1} tokens costs {ratios[top]:.1f}x one)"})
    if not pays:
        cost_cause = bool(causes)
        if a1 < LOW_ACCEPTANCE or (not cost_cause and model[bm]["speedup"] < 1.0):
            causes.append({"cause": "low_acceptance", "message":
                           f"acceptance too low: {a1:.0%} of first drafts accepted, {won:.2f} tokens won per step "
                           f"at K={k}, against a step overhead of {overhead:.2f} target tokens"
                           + (f"; the drafter proposed nothing in {1 - cov1:.0%} of steps" if cov1 < 0.9 else "")})
        if not causes:
            causes.append({"cause": "overhead", "message":
                           f"per-step overhead outside the cost model (host syncs, sampling, cache rollback, "
                           f"prefill) eats the gain: predicted {model[bm]['speedup']:.2f}x at K={k}, measured "
                           f"{sp:.2f}x"})
        lines += [f"why: {c['message']}" for c in causes]
    else:
        lines += [f"note: {c['message']}" for c in causes]
    out["causes"] = causes
    out["verdict"] = lines
    return out


# ----------------------------------------------------------------------------- measurements


def step_rooms(accepted: Sequence[int], k: int, limit: int) -> list[int]:
    """How many drafts the engine allowed at each step: min(K, limit - emitted - 1), emitted
    reconstructed as sum(accepted + 1) of the earlier steps (exact but for a final step cut by
    end-of-sequence, which ends the run anyway)."""
    rooms, emitted = [], 0
    for a in accepted:
        rooms.append(max(0, min(k, limit - emitted - 1)))
        emitted += a + 1
    return rooms


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


def time_verify(model, prompt: list[int], sizes: Sequence[int], reps: int = VERIFY_REPS,
                progress: Callable[[int], Any] | None = None) -> dict[int, list[float]]:
    """ms of one target forward over n tokens, for each n in ``sizes``, on a cache holding the
    prefilled ``prompt``; trimmed back after every pass. Two untimed passes per size first; then
    ``reps`` rounds over all sizes, the order rotating to spread drift. {n: [ms, ...]}."""
    from mlxspec.core.prefill import prefill

    cache = model.make_cache()
    mx.eval(prefill(model, cache, prompt))
    src = prompt if prompt else [0]
    toks = {n: mx.array([[src[i % len(src)] for i in range(n)]], mx.int32) for n in sizes}

    def once(n: int) -> float:
        t0 = time.perf_counter()
        mx.eval(model(toks[n], cache))
        dt = (time.perf_counter() - t0) * 1e3
        for c in cache:
            c.trim(n)
        return dt

    for n in sizes:
        once(n)
        once(n)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    order = list(sizes)
    for rep in range(reps):
        rot = rep % len(order)
        for n in order[rot:] + order[:rot]:
            times[n].append(once(n))
        if progress is not None:
            progress(rep + 1)
    return times


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _spread(xs: Sequence[float]) -> dict[str, float | None]:
    return {"median": _median(xs), "min": min(xs) if xs else None, "max": max(xs) if xs else None}


# ----------------------------------------------------------------------------- the sweep


def run_sweep(
    ks: Sequence[int],
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
) -> dict[str, Any]:
    """Sweep K for ``draft`` on ``model_spec`` (a ``loading.load`` spec or a loaded model).

    Prompts: ``bench.spec_bench_prompts(categories, per_category, prompts_file)`` (default: the
    first question of each of the six Spec-Bench subtasks). ``progress(done, total, label)``.
    ``on_run(run)`` after every timed run, for live displays: plain values {k (0 = target-only),
    prompt_id, category, repeat, tps, accepted, drafted (per step), done, of (runs of this K)}.
    Result (JSON-serialisable): date, machine, backend, blas, mlx_version, mlx_lm_version,
    model, dtype, settings, note, prompts, baseline{tps, tps_min, tps_max, decode_tps,
    ms_per_token, runs}, rows[per K: k, tps, tps_min, tps_max, decode_tps, speedup,
    speedup_min, speedup_max, acceptance, acceptance_cumulative, draft_coverage, mean_accepted,
    tokens_per_step, mean_drafted, draft_ms_per_token, draft_ms_per_step, verify_ms_per_step,
    verify_ms, verify_ratio, expected_tokens, predicted_tps, predicted_speedup,
    greedy_identical, is_optimum], verification{target_ms, per_k[{k, tokens, ms, ratio,
    ms_all}], slope, kind}, optimum_measured{k, tps, speedup}, optimum_predicted{k, tps,
    speedup}, pays, causes[{cause, message}], verdict[str], runs[compact per-run rows].
    """
    from mlxspec.core.sampling import SamplingParams

    if isinstance(ks, str):
        ks = parse_ks(ks)
    ks = sorted(set(int(k) for k in ks))
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
    params = SamplingParams(temperature=float(temp), top_p=float(top_p))

    items, note = spec_bench_prompts(list(categories) if categories else None, per_category, prompts_file)
    lm, drafter, stop, ids = prepare_speculative_run(
        model_spec, draft, dtype, items, max_tokens,
        no_drafter="a sweep needs a drafter (got 'none'): e.g. --draft ngram:3 or self:8")

    methods: list[int] = [0] + ks  # 0 = target-only
    sizes = sorted({1} | {k + 1 for k in ks})
    total = warmup * len(methods) + verify_reps + repeats * len(items) * len(methods)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    def label(m: int) -> str:
        return "target-only" if m == 0 else f"K={m}"

    def run(m: int, p: list[int], n: int) -> dict[str, Any]:
        return _mlxspec_run("target" if m == 0 else "spec", lm, p, params, n, stop, seed,
                            drafter if m else None, m or 1)

    for w in range(warmup):
        for m in methods:
            run(m, ids[0], min(max_tokens, WARMUP_TOKENS))
            tick(f"warm-up {w + 1}/{warmup} · {label(m)}")

    vt = time_verify(lm.model, ids[0], sizes, verify_reps,
                     progress=lambda r: tick(f"verify cost · {r}/{verify_reps} rounds over {len(sizes)} sizes"))

    rows_by: dict[int, list[dict[str, Any]]] = {m: [] for m in methods}
    pair = 0
    for r in range(repeats):
        for it, p in zip(items, ids):
            rot = pair % len(methods)
            pair += 1
            got = {}
            for m in methods[rot:] + methods[:rot]:
                row = run(m, p, max_tokens)
                row.update(k=m, prompt_id=it["id"], category=it["category"], repeat=r,
                           limit=min(max_tokens, lm.context_length - len(p)))
                got[m] = row
                rows_by[m].append(row)
                if on_run is not None:
                    on_run({"k": m, "prompt_id": it["id"], "category": it["category"], "repeat": r,
                            "tps": row["tps"], "accepted": list(row["accepted"]), "drafted": list(row["drafted"]),
                            "done": len(rows_by[m]), "of": repeats * len(items)})
                tick(f"{label(m)} · {it['category']} #{it['id']} · repeat {r + 1}/{repeats}")
            for m in ks:
                got[m]["ratio"] = got[m]["tps"] / got[0]["tps"] if got[0]["tps"] > 0 else None
                got[m]["first_mismatch"] = _first_mismatch(got[0]["tokens"], got[m]["tokens"]) if params.greedy else None

    target_ms = statistics.median(vt[1])
    base_rows = rows_by[0]
    base_tps = [x["tps"] for x in base_rows]
    baseline = {
        **{f"tps{'' if k == 'median' else '_' + k}": v for k, v in _spread(base_tps).items()},
        "decode_tps": _median([x["decode_tps"] for x in base_rows if x["decode_tps"] is not None]),
        "ms_per_token": _median([v for x in base_rows for v in x["verify_ms"]]),
        "runs": len(base_rows),
    }

    rows = []
    for k in ks:
        rs = rows_by[k]
        acc_l = [a for x in rs for a in x["accepted"]]
        dft_l = [d for x in rs for d in x["drafted"]]
        room_l = [rm for x in rs for rm in step_rooms(x["accepted"], k, x["limit"])]
        acc, cov = position_acceptance(acc_l, dft_l, room_l, k)
        full = [a for a, rm in zip(acc_l, room_l) if rm == k]
        dms = [v for x in rs for v in x["draft_ms"]]
        ratios = [x["ratio"] for x in rs if x.get("ratio") is not None]
        tps = [x["tps"] for x in rs]
        mism = [x["prompt_id"] for x in rs if x.get("first_mismatch") is not None]
        vms = statistics.median(vt[k + 1])
        rows.append({
            "k": k,
            "runs": len(rs),
            "tps": _median(tps), "tps_min": min(tps), "tps_max": max(tps),
            "decode_tps": _median([x["decode_tps"] for x in rs if x["decode_tps"] is not None]),
            "speedup": _median(ratios), "speedup_min": min(ratios, default=None),
            "speedup_max": max(ratios, default=None),
            "acceptance": acc,
            "acceptance_cumulative": acceptance_by_position(acc_l, dft_l, k),
            "draft_coverage": cov,
            "mean_accepted": sum(full) / len(full) if full else (sum(acc_l) / len(acc_l) if acc_l else None),
            "tokens_per_step": sum(x["generated_tokens"] for x in rs) / max(1, sum(x["steps"] for x in rs)),
            "mean_drafted": sum(dft_l) / len(dft_l) if dft_l else None,
            "draft_ms_per_token": sum(dms) / max(1, sum(dft_l)),
            "draft_ms_per_step": _median(dms),
            "verify_ms_per_step": _median([v for x in rs for v in x["verify_ms"]]),
            "verify_ms": vms,
            "verify_ratio": vms / target_ms,
            "greedy_identical": (not mism) if params.greedy else None,
            "greedy_mismatches": mism,
        })

    d = diagnose(ks, [x["tps"] for x in rows], [x["speedup"] for x in rows], [x["acceptance"] for x in rows],
                 [x["draft_ms_per_token"] for x in rows], [x["verify_ms"] for x in rows], target_ms,
                 baseline["tps"], coverage=[x["draft_coverage"] for x in rows])
    best = d["optimum_measured"]["k"] if d["optimum_measured"] else None
    for row, pm in zip(rows, d["predicted"]):
        row.update(expected_tokens=pm["expected_tokens"], predicted_tps=pm["tps"],
                   predicted_speedup=pm["speedup"], is_optimum=row["k"] == best)
    verdict = list(d["verdict"])
    top = next((x for x in rows if x["k"] == best), None)
    if top and top["speedup_min"] is not None and top["speedup_min"] < 1.0 <= top["speedup_max"] and top["runs"] > 1:
        verdict.append(f"note: per prompt the speedup at K={best} ranges {top['speedup_min']:.2f}x-"
                       f"{top['speedup_max']:.2f}x: it pays on some prompts and loses on others (more "
                       f"prompts or --repeats narrow the median)")
    bad = [f"K={x['k']} (prompts {', '.join(map(str, x['greedy_mismatches']))})" for x in rows if x["greedy_mismatches"]]
    if bad:
        verdict.append("BUG: greedy speculative output differs from target-only at " + "; ".join(bad))

    return {
        **run_header(lm),
        "settings": {
            "ks": ks, "draft": draft, "temperature": float(temp), "top_p": float(top_p),
            "categories": list(dict.fromkeys(it["category"] for it in items)),
            "per_category": per_category if prompts_file is None else None,
            "prompts_file": str(prompts_file) if prompts_file is not None else None,
            "max_tokens": max_tokens, "warmup": warmup, "warmup_tokens": min(max_tokens, WARMUP_TOKENS),
            "repeats": repeats, "seed": seed, "verify_reps": verify_reps,
            "headline": "end-to-end tokens/s = generated tokens / (prefill_s + decode_s), median over runs",
            "speedup": "median over (prompt, repeat) pairs of K tokens/s / target-only tokens/s",
            "acceptance": "conditional per position: P(draft i accepted | drafts before it accepted); "
                          "a position the drafter left empty counts as rejected",
            "cost_model": "E(K) = 1 + sum_j prod_{i<=j} a_i; T(K) = K*draft_ms_per_token + verify_ms(K); "
                          "predicted tps = E/T; target-only = 1/verification.target_ms",
        },
        "note": note,
        "prompts": [{"id": it["id"], "category": it["category"], "prompt_tokens": len(p)}
                    for it, p in zip(items, ids)],
        "baseline": baseline,
        "rows": rows,
        "verification": {
            "target_ms": target_ms,
            "target_ms_all": vt[1],
            "context_tokens": len(ids[0]),
            "per_k": [{"k": k, "tokens": k + 1, "ms": statistics.median(vt[k + 1]),
                       "ratio": statistics.median(vt[k + 1]) / target_ms, "ms_all": vt[k + 1]} for k in ks],
            "slope": d["verify_slope"],
            "kind": d["verify_kind"],
        },
        "optimum_measured": d["optimum_measured"],
        "optimum_predicted": d["optimum_predicted"],
        "pays": d["pays"],
        "causes": d["causes"],
        "verdict": verdict,
        "runs": [{"k": x["k"], "prompt_id": x["prompt_id"], "category": x["category"], "repeat": x["repeat"],
                  "tps": x["tps"], "decode_tps": x["decode_tps"], "generated_tokens": x["generated_tokens"],
                  "prompt_tokens": x["prompt_tokens"], "steps": x["steps"], "stop_reason": x["stop_reason"],
                  "total_s": x["total_s"]} for m in methods for x in rows_by[m]],
    }


# ----------------------------------------------------------------------------- output


def print_sweep(result: dict[str, Any], console) -> None:
    """A rich table (target-only, then one row per K, the optimum starred), the verification
    parallelism and the verdict."""
    from rich.table import Table

    s, b, v = result["settings"], result["baseline"], result["verification"]
    temp = "greedy" if s["temperature"] == 0 else f"T={s['temperature']:g}, top-p={s['top_p']:g}"
    table = Table(
        title=f"K sweep: {result['model']} ({result['dtype']}) + {s['draft']}, {temp} — {result['backend']}",
        caption=(f"{len(result['prompts'])} prompts x {s['repeats']} repeat(s), {s['max_tokens']} new tokens max, "
                 f"{s['warmup']} warm-up; tok/s end-to-end, median \\[min-max] over runs; speedup: median per prompt; "
                 f"acc: conditional acceptance by draft position; verify x1: one target pass over K+1 tokens / "
                 f"one token (median of {s['verify_reps']}); pred: cost model"),
    )
    for col, just in (("K", "right"), ("tok/s", "right"), ("min-max", "right"), ("speedup", "right"),
                      ("acc by position", "left"), ("accepted/step", "right"), ("draft ms/tok", "right"),
                      ("verify ms/step", "right"), ("verify x1", "right"), ("pred tok/s", "right"),
                      ("pred speedup", "right")):
        table.add_column(col, justify=just)
    table.add_row("target", _f(b["tps"]), f"{_f(b['tps_min'])}-{_f(b['tps_max'])}", "1.00x", "", "", "",
                  _f(b["ms_per_token"], "{:.1f}"), "1.00x", _f(1e3 / v["target_ms"] if v["target_ms"] else None),
                  "1.00x", style="dim", end_section=True)
    best_p = (result.get("optimum_predicted") or {}).get("k")
    for row in result["rows"]:
        sp = _f(row["speedup"], "{:.2f}x")
        if row["speedup"] is not None and row["speedup"] < 1:
            sp = f"[red]{sp}[/]"
        pred = _f(row["predicted_tps"])
        if row["k"] == best_p:
            pred += " ◆"
        table.add_row(
            f"{row['k']} ★" if row["is_optimum"] else str(row["k"]),
            _f(row["tps"]), f"{_f(row['tps_min'])}-{_f(row['tps_max'])}", sp, _acc(row["acceptance"]),
            _f(row["mean_accepted"], "{:.2f}"), _f(row["draft_ms_per_token"], "{:.2f}"),
            _f(row["verify_ms_per_step"]), _f(row["verify_ratio"], "{:.2f}x"), pred,
            _f(row["predicted_speedup"], "{:.2f}x"),
            style="bold green" if row["is_optimum"] and result["pays"] else "bold" if row["is_optimum"] else None,
        )
    console.print(table)
    per = ", ".join(f"K+1={p['tokens']}: {p['ratio']:.2f}x" for p in v["per_k"])
    console.print(f"verification parallelism: one target token {v['target_ms']:.1f} ms; {per} -> "
                  f"[bold]{v['kind']}[/] (+{v['slope']:.2f} token-times per extra draft; flat = 0, serial = 1)",
                  highlight=False)
    if result.get("note"):
        console.print(f"[yellow]note:[/] {result['note']}")
    for i, line in enumerate(result["verdict"]):
        if line.startswith("BUG") or (i == 0 and not result["pays"]):
            style = "bold red"
        elif i == 0:
            style = "bold green"
        elif line.startswith("why:"):
            style = "red"
        elif line.startswith("note:"):
            style = "yellow"
        else:
            style = ""
        console.print(f"[{style}]{line}[/]" if style else line, highlight=False)


CSV_FIELDS = ("k", "tps", "tps_min", "tps_max", "decode_tps", "speedup", "speedup_min", "speedup_max",
              "mean_accepted", "tokens_per_step", "mean_drafted", "draft_ms_per_token", "draft_ms_per_step",
              "verify_ms_per_step", "verify_ms", "verify_ratio", "expected_tokens", "predicted_tps",
              "predicted_speedup", "is_optimum", "baseline_tps")


def write_csv(result: dict[str, Any], path: str | Path) -> Path:
    """One row per K: the scalar columns ``CSV_FIELDS`` then acc_1..acc_maxK (conditional
    acceptance by position; empty beyond K or where no step reached it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kmax = max((r["k"] for r in result["rows"]), default=0)
    acc_cols = [f"acc_{i + 1}" for i in range(kmax)]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([*CSV_FIELDS, *acc_cols])
        for r in result["rows"]:
            vals = {**r, "baseline_tps": result["baseline"]["tps"]}
            acc = list(r["acceptance"]) + [None] * (kmax - len(r["acceptance"]))
            w.writerow([("" if vals.get(c) is None else vals[c]) for c in CSV_FIELDS]
                       + ["" if a is None else a for a in acc])
    return path


def plot_sweep(result: dict[str, Any], path: str | Path) -> Path:
    """PNG, three panels against K: tokens/s (measured median with min-max bars, the cost model,
    target-only as a horizontal line, the optimum starred); acceptance (first position, mean
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
    rows, s, b, v = result["rows"], result["settings"], result["baseline"], result["verification"]
    ks = [r["k"] for r in rows]
    fig = Figure(figsize=(15, 4.8), dpi=110, layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    temp = "greedy" if s["temperature"] == 0 else f"T={s['temperature']:g}"
    fig.suptitle(f"K sweep: {result['model']} ({result['dtype']}) + {s['draft']}, {temp} — {result['backend']}",
                 fontsize=11)

    # 1. tokens/s
    tps = [r["tps"] for r in rows]
    lo = [r["tps"] - r["tps_min"] for r in rows]
    hi = [r["tps_max"] - r["tps"] for r in rows]
    ax1.errorbar(ks, tps, yerr=[lo, hi], marker="o", capsize=3, color="tab:blue",
                 label="speculative, measured (median, min-max over runs)")
    ax1.plot(ks, [r["predicted_tps"] for r in rows], "--", marker="s", markersize=4, color="tab:purple",
             alpha=0.8, label="cost model prediction")
    ax1.axhline(b["tps"], color="tab:gray", linestyle="-", linewidth=1.5, label=f"target-only ({b['tps']:.1f} tok/s)")
    ax1.axhspan(b["tps_min"], b["tps_max"], color="tab:gray", alpha=0.12)
    om, op = result.get("optimum_measured"), result.get("optimum_predicted")
    if om:
        ax1.plot([om["k"]], [om["tps"]], marker="*", markersize=18, color="gold", markeredgecolor="black",
                 linestyle="none", label=f"measured optimum K={om['k']} ({om['speedup']:.2f}x)", zorder=5)
    if op:
        ax1.plot([op["k"]], [op["tps"]], marker="D", markersize=8, color="none", markeredgecolor="tab:purple",
                 linestyle="none", label=f"predicted optimum K={op['k']} ({op['speedup']:.2f}x)", zorder=5)
    ax1.set_xlabel("K (draft tokens per step)")
    ax1.set_ylabel("tokens/s (end-to-end)")
    ax1.set_title("throughput")
    ax1.set_xticks(ks)
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="lower right")

    # 2. acceptance
    first = [r["acceptance"][0] if r["acceptance"] and r["acceptance"][0] is not None else float("nan") for r in rows]
    mean_rate = [(r["mean_accepted"] or 0.0) / r["k"] for r in rows]
    ax2.plot(ks, first, marker="o", color="tab:green", label="acceptance at position 1")
    ax2.plot(ks, mean_rate, marker="o", color="tab:olive", label="accepted drafts / K")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("K")
    ax2.set_ylabel("acceptance rate")
    ax2.set_title("acceptance")
    ax2.set_xticks(ks)
    ax2.grid(alpha=0.3)
    tw = ax2.twinx()
    tw.plot(ks, [r["mean_accepted"] or 0.0 for r in rows], marker="^", linestyle=":", color="tab:red",
            label="mean accepted length")
    tw.set_ylabel("accepted drafts per step", color="tab:red")
    top_len = max([r["mean_accepted"] or 0.0 for r in rows], default=0.0)
    tw.set_ylim(0, max(1.0, 1.15 * top_len))
    if om:
        ax2.axvline(om["k"], color="gold", linewidth=2, alpha=0.6)
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")

    # 3. verification parallelism
    ratios = [p["ratio"] for p in v["per_k"]]
    ax3.plot(ks, ratios, marker="o", color="tab:orange", label="measured: pass over K+1 tokens / 1 token")
    ax3.plot(ks, [1.0] * len(ks), "--", color="tab:green", label="flat (batch-parallel)")
    ax3.plot(ks, [k + 1 for k in ks], "--", color="tab:red", label="linear (serial)")
    ax3.set_xlabel("K")
    ax3.set_ylabel("cost relative to one token")
    ax3.set_title(f"verification: {v['kind']} (+{v['slope']:.2f}/token)")
    ax3.set_xticks(ks)
    ax3.set_ylim(bottom=0)
    ax3.grid(alpha=0.3)
    ax3.legend(fontsize=8, loc="upper left")

    fig.savefig(path, format="png")
    return path
