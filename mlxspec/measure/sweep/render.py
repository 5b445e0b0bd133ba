"""A sweep's result on a console (a rich table: target-only, then one row per K, auto and tree
shape, the optimum starred; the verification parallelism; the verdict, each line coloured by
its kind) and as files (CSV, PNG). Rendering only: every number shown is in the result record."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from rich.table import Table

from mlxspec.measure.runs import fmt, fmt_list
from mlxspec.measure.sweep.plot import plot_sweep
from mlxspec.measure.sweep.records import KRow, SweepResult
from mlxspec.measure.verdict import Kind, markup


def _speedup_cell(row: KRow) -> str:
    sp = fmt(row.speedup, "{:.2f}x")
    return markup(row.comparison.kind, sp) if row.comparison.kind in (Kind.FASTER, Kind.SLOWER) else sp


def _k_cell(row: KRow) -> str:
    name = (row.label if row.tree else f"auto ({fmt(row.mean_k, '{:.1f}')})" if row.k is None else str(row.k))
    return f"{name} ★" if row.is_optimum else f"{name} ≈" if row.indistinguishable else name


def _sweep_table(result: SweepResult) -> Table:
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


def write_files(result: SweepResult, csv_path: str | Path | None, plot_path: str | Path | None) -> Iterator[Path]:
    """The CSV and the PNG asked for (None: not asked), each yielded as soon as it is written."""
    if csv_path is not None:
        yield write_csv(result, csv_path)
    if plot_path is not None:
        yield plot_sweep(result, plot_path)
