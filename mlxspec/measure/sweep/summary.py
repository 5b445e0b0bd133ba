"""The sweep's result from its timed runs: a row per K (acceptance by position, costs, paired
speedup), the target-only baseline, the verify costs, the diagnosis, and the auto and tree rows
each judged paired against the best fixed K. Pure: the demo and the tests feed it scripted runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mlxspec.core.runs import acceptance_by_position
from mlxspec.measure.runs import RunHeader, fmt
from mlxspec.measure.sweep.diagnosis import Diagnosis, Measured, diagnose
from mlxspec.measure.sweep.records import (
    Baseline,
    KRow,
    SweepResult,
    SweepRun,
    SweepSettings,
    Verification,
    VerifyCost,
    tree_method,
)
from mlxspec.measure.verdict import Comparison, Kind, Verdict, median_ratio


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
    d = diagnose(Measured(ks, [x.tps for x in rows], [x.comparison for x in rows], [x.acceptance for x in rows],
                          [x.draft_ms_per_token for x in rows], [x.verify_ms for x in rows], target_ms, baseline.tps,
                          coverage=[x.draft_coverage for x in rows], paired_tps=_paired_tps(ks, runs_by)))
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
