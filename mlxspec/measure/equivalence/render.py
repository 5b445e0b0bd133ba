"""A verify result drawn: the sampling check (its totals, the most frequent bins, chi2 and the
permutation p-value), the greedy check (agreement and its divergences), and one verdict."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from mlxspec.measure.verdict import Kind, markup


def _verdict(ok: bool) -> str:
    return markup(Kind.PASS, "PASS") if ok else markup(Kind.FAIL, "FAIL")


def _print_sampling(r: dict[str, Any], console) -> None:
    s, t, sp = r["settings"], r["target_only"], r["speculative"]
    console.print(
        f"[bold]Sampling equivalence[/] · {r['model']} ({r['dtype']}), draft {r['draft']}, K={r['k']}, "
        f"T={s['temperature']}, top-p={s['top_p']} · {r['backend']}"
    )
    console.print(
        f"  target-only: {t['tokens']} tokens in {t['sequences']} sequences, {t['elapsed_s']:.1f} s "
        f"({t['tokens_per_s']:.1f} tok/s)"
    )
    console.print(
        f"  speculative: {sp['tokens']} tokens in {sp['sequences']} sequences, {sp['elapsed_s']:.1f} s "
        f"({sp['tokens_per_s']:.1f} tok/s); acceptance {sp.get('acceptance_rate', 0):.1%}, "
        f"tau {sp.get('tau', 0):.2f} accepted/step, {sp.get('tokens_per_step', 0):.2f} tokens/step"
    )
    named = [b for b in r["bins"] if b["id"] is not None]
    table = Table(title=f"most frequent of {len(named)} binned token ids ({r['distinct_ids']} distinct seen)")
    for col, just in (("id", "right"), ("token", "left"), ("target-only", "right"), ("speculative", "right")):
        table.add_column(col, justify=just)
    for b in named[:10] + [b for b in r["bins"] if b["id"] is None]:
        table.add_row("" if b["id"] is None else str(b["id"]), repr(b["text"]), str(b["target_only"]),
                      str(b["speculative"]))
    console.print(table)
    console.print(f"  chi2 = {r['chi2']:.1f}, dof = {r['dof']}, p = {r['p']:.3f} (asymptotic, assumes independent tokens)")
    console.print(f"  permutation p = {r['p_permutation']:.3f} ({r['permutations']} paired sequence swaps: null chi2 "
                  f"mean {r['permutation_null_mean']:.1f}, 99th percentile {r['permutation_null_q99']:.1f}; "
                  f"pass iff p > {r['alpha']})")
    console.print(f"  sampling: {_verdict(r['passed'])}")


def _print_greedy(r: dict[str, Any], console) -> None:
    s, sm, sp = r["settings"], r["summary"], r["speculative"]
    console.print(
        f"[bold]Greedy equivalence[/] · {r['model']} ({r['dtype']}), draft {r['draft']}, K={r['k']} · "
        f"{s['prompts']} prompts x {s['tokens']} tokens"
    )
    console.print(
        f"  {sm['identical']}/{sm['prompts']} prompts identical, {sm['tokens_agreeing']}/{sm['tokens_compared']} "
        f"tokens agree before any divergence; near-ties {sm['near_ties']} (gap < {s['near_tie']:g}), "
        f"real mismatches {sm['mismatches']}"
    )
    console.print(
        f"  speculative: acceptance {sp.get('acceptance_rate', 0):.1%}, {sp.get('tokens_per_step', 0):.2f} tokens/step, "
        f"{sp['tokens_per_s']:.1f} tok/s vs target-only {r['target_only']['tokens_per_s']:.1f} tok/s"
    )
    diverged = [x for x in r["results"] if not x["identical"]]
    if diverged:
        table = Table(title="divergences")
        for col in ("prompt", "at", "target-only", "speculative", "top-2 gap", "verdict"):
            table.add_column(col)
        for x in diverged:
            gap = f"{x['top2_gap']:.2e}" if "top2_gap" in x else x.get("reason", "-")
            table.add_row(f"{x['category']} #{x['id']}", str(x["diverged_at"]), repr(x.get("target_text", "")),
                          repr(x.get("spec_text", "")), gap,
                          "near-tie" if x["classification"] == "near_tie" else markup(Kind.CAUSE, "mismatch"))
        console.print(table)
    console.print(f"  greedy: {_verdict(r['passed'])}")


def print_verify(result: dict[str, Any], console) -> None:
    """Render a ``sampling_check`` or ``greedy_check`` result, or ``{"sampling": ..., "greedy": ...}``
    with either or both, then an overall verdict when both are there."""
    parts = {result["check"]: result} if "check" in result else {k: v for k, v in result.items()
                                                                  if k in ("sampling", "greedy") and v}
    if "sampling" in parts:
        _print_sampling(parts["sampling"], console)
    if "greedy" in parts:
        _print_greedy(parts["greedy"], console)
    if len(parts) > 1:
        ok = all(p["passed"] for p in parts.values())
        console.print(f"verify: {_verdict(ok)}")
