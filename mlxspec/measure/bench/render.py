"""Both benchmarks' results on a console: rich tables, then the verdicts, each line coloured by
its kind. Rendering only: every number shown is already in the result record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from mlxspec.measure.bench.summary import Aggregate, TempResult
from mlxspec.measure.bench.baseline import BaselineResult
from mlxspec.measure.bench.common import TORCH_PREFIX, fmt_t, label, ratio
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.bench.speculative import SpecBenchResult
from mlxspec.measure.runs import fmt, fmt_list
from mlxspec.measure.verdict import Kind, Verdict, markup


def _load(h: Any) -> str:
    """How busy other processes kept the machine while it ran, for a table's caption."""
    return "" if h.others_busy is None else f". Other processes kept {h.others_busy:.0%} of the CPUs busy"


def _baseline_table(result: BaselineResult) -> Table:
    s, h = result.settings, result.header
    prompts = ", ".join(f"{p['category']} #{p['id']} ({p['prompt_tokens']} tok)" for p in s.prompts)
    on_torch = f"; {result.torch.description}" if result.torch is not None else ""
    table = Table(
        title=f"Baseline decoding: {h.model} ({h.dtype}), {h.backend}{on_torch}",
        caption=(f"{s.max_tokens} tokens per run, {s.warmup} warm-up, {s.repeats} repeats x "
                 f"{len(s.prompts)} prompts: {prompts}{_load(h)}"),
    )
    for col, just in (("implementation", "left"), ("decode tok/s (median)", "right"), ("min - max", "right"),
                      ("prefill tok/s", "right"), ("ms/token", "right"), ("x floor", "right"),
                      ("/ mlxspec", "right")):
        table.add_column(col, justify=just, no_wrap=col == "implementation")
    ref = result.implementations["mlxspec"].decode_tps_median
    for key, st in result.implementations.items():
        table.add_row(label(key), f"{st.decode_tps_median:.1f}",
                      f"{st.decode_tps_min:.1f} - {st.decode_tps_max:.1f}", f"{st.prefill_tps_median:.0f}",
                      f"{st.ms_per_token:.2f}", f"{st.floor_ratio:.2f}x", fmt(ratio(st.decode_tps_median, ref), "{:.2f}x"))
    floor = result.floor_ms_per_token
    table.add_row("bandwidth floor", f"{1e3 / floor:.1f}" if floor > 0 else "-", "", "", f"{floor:.2f}", "1.00x", "",
                  style="dim")
    return table


def print_baseline(result: BaselineResult, console) -> None:
    """Render a ``baseline_bench`` result as a rich table plus a short summary."""
    console.print(_baseline_table(result))
    g = result.goals
    ok = lambda b: "[green]yes[/]" if b else "[red]no[/]"
    console.print(f"ratio mlxspec / mlx-lm (decode): [bold]{result.ratio:.3f}[/] "
                  f"(goal >= 1.0: {ok(g.mlxspec_at_least_mlx_lm)})")
    console.print(markup(result.verdict.kind, result.verdict.text), highlight=False)
    console.print(
        f"bandwidth {result.bandwidth_gbs:.1f} GB/s, {result.weight_bytes_per_token / 1e6:.1f} MB of weights "
        f"per token -> floor {result.floor_ms_per_token:.2f} ms/token; mlxspec at "
        f"{result.floor_ratio['mlxspec']:.2f}x the floor (goal <= 1.5x: {ok(g.mlxspec_within_1_5x_floor)})"
    )
    if result.same_tokens is not None and result.same_tokens < 1:
        console.print(f"[yellow]note:[/] identical greedy tokens in {result.same_tokens:.0%} of run pairs")
    if result.torch is not None:
        _print_torch(result, console)


def _print_torch(result: BaselineResult, console) -> None:
    """Per torch column: its verdict against mlxspec on MLX and whether its greedy tokens match."""
    t, s, ref = result.torch, result.settings, result.header.dtype
    seen: set[str] = set()
    for col in t.columns.values():
        console.print(markup(col.verdict.kind, col.verdict.text), highlight=False)
        if col.dtype in seen:  # the same weights at another thread count: the same tokens
            continue
        seen.add(col.dtype)
        if col.agrees:
            console.print(f"  torch {col.dtype}: the same greedy tokens as MLX ({ref}) for all "
                          f"{len(s.prompts)} prompts x {s.max_tokens} tokens", highlight=False)
        else:
            where = ", ".join(f"#{p['id']} at token {d}" for p, d in zip(s.prompts, col.first_divergence)
                              if d is not None)
            why = ("the file's 4-bit weights with bfloat16 products: another target, not a twin of MLX's "
                   "(speculation on it is exact against it)" if col.dtype == "quantized" else "not exact enough")
            console.print(markup(Kind.NOTE, f"  torch {col.dtype}: greedy tokens leave MLX's ({ref}): "
                                            f"{where}; {why}"), highlight=False)
    best = t.fastest_exact
    console.print(f"fastest torch column with MLX's tokens: [bold]{label(TORCH_PREFIX + best) if best else 'none'}[/]"
                  + (f" ({t.columns[best].ratio:.2f}x mlxspec on MLX)" if best else ""))


def _speedup_cell(a: Aggregate) -> str:
    sp = fmt(a.speedup, "{:.2f}x")
    kind = a.comparison.kind
    if kind is Kind.SLOWER:
        sp = markup(kind, f"{sp} SLOWER")
    elif kind is Kind.FASTER:
        sp = markup(kind, sp)
    if a.greedy_mismatches:
        sp += " " + markup(Kind.BUG, "MISMATCH")
    return sp


def _spec_columns(peer: bool, against: bool = False, cpp: bool = False) -> list[tuple[str, str]]:
    cols = [("category", "left"), ("target\ntok/s", "right"), ("spec\ntok/s", "right"), ("speedup", "right"),
            ("95%\ninterval", "right"), ("median", "right"), ("tau", "right"), ("acc by\nposition", "left"),
            ("draft\nms", "right"), ("verify\nms", "right")]
    if against:
        cols += [("against\ntok/s", "right"), ("vs\nagainst", "right"), ("against\ntau", "right")]
    if peer:
        cols += [("mlx-lm\ntok/s", "right"), ("vs\nmlx-lm", "right"), ("mlx-lm\ntau", "right")]
    if cpp:
        cols += [("llama.cpp\ntok/s", "right"), ("vs\nllama.cpp", "right")]
    return cols


def _spec_cells(name: str, a: Aggregate, peer: bool, against: bool = False, cpp: bool = False) -> list[str]:
    s, iv = a.spec, a.comparison.interval
    cells = [name, fmt(a.target_tps), fmt(a.spec_tps), _speedup_cell(a), "-" if iv is None else str(iv),
             fmt(a.speedup_median, "{:.2f}x"), fmt(s and s.tau, "{:.2f}"),
             fmt_list(s.acceptance if s else [None] * a.k), fmt(s and s.draft_ms), fmt(s and s.verify_ms)]
    if against:
        r = a.against
        cells += [fmt(r and r.stats.tps), fmt(r and r.ratio, "{:.2f}x"), fmt(r and r.stats.tau, "{:.2f}")]
    if peer:
        m = a.mlx_lm
        cells += [fmt(m and m.stats.tps), fmt(m and m.ratio, "{:.2f}x"), fmt(m and m.stats.tau, "{:.2f}")]
    if cpp:
        c = a.llama_cpp
        cells += [fmt(c and c.stats.tps), fmt(c and c.ratio, "{:.2f}x")]
    return cells


def _spec_table(result: SpecBenchResult, res: TempResult) -> Table:
    s, h = result.settings, result.header
    peer = result.peer.target is not None
    against = s.against is not None
    cpp = s.llama_cpp is not None
    per_cat = f" ({s.per_category} per category)" if s.per_category and not s.prompts_file else ""
    shape = f"tree={s.tree}" if s.tree else f"k={s.k}"
    filters = SamplingParams(top_p=s.top_p, min_p=s.min_p).filters_label if res.temperature > 0 else ""
    table = Table(
        title=(f"Speculative decoding, {fmt_t(res.temperature)}{filters}: {h.model} ({h.dtype}) + {s.draft}, {shape} "
               f"— {h.backend}"),
        caption=(f"{len(result.prompts)} prompts{per_cat}, {s.max_tokens} new tokens max, {s.warmup} warm-up, "
                 f"{s.repeats} repeat(s). tok/s end-to-end (prefill included); speedup = summed spec tok/s / "
                 f"summed target tok/s, 95% interval: bootstrap over (prompt, repeat) pairs (median: of per-prompt "
                 f"ratios); tau = accepted drafts per step; acc = acceptance by draft position"
                 + (f"; vs against = {s.draft} / {s.against} tok/s" if against else "")
                 + ("; vs mlx-lm = mlxspec / mlx-lm tok/s" if peer else "")
                 + (f"; vs llama.cpp = {s.draft} / {s.llama_cpp}" if cpp else "") + _load(h)),
    )
    entries = list(res.categories.items()) + [("overall", res.overall)]
    rows = [_spec_cells(name, a, peer, against, cpp) for name, a in entries]
    for c, (col, just) in enumerate(_spec_columns(peer, against, cpp)):
        # never cut a number: a column may wrap at spaces but is at least its longest word wide
        longest = max(len(w) for r in rows for w in Text.from_markup(r[c]).plain.split())
        table.add_column(col, justify=just, no_wrap=c == 0, min_width=longest)
    for i, cells in enumerate(rows):
        table.add_row(*cells, style="bold" if i == len(rows) - 1 else None, end_section=i == len(rows) - 2)
    return table


def print_verdicts(verdicts: Sequence[Verdict], console) -> None:
    """One line per verdict, coloured by its kind."""
    for v in verdicts:
        console.print(markup(v.kind, v.text), highlight=False)


def print_spec(result: SpecBenchResult, console) -> None:
    """Render a ``spec_bench`` result: one rich table per temperature, then the verdicts."""
    for res in result.results:
        console.print(_spec_table(result, res))
    if result.note:
        console.print(f"[yellow]note:[/] {result.note}")
    if result.peer.target is None and result.settings.with_mlx_lm:
        console.print(f"[dim]mlx-lm peer: none ({result.peer.reason})[/]")
    elif result.peer.target is not None:
        per_step = "" if result.peer.draft is None else f", {result.settings.mlx_lm_k} draft tokens a step"
        console.print(f"[dim]mlx-lm peer: {result.peer.description}{per_step}[/]")
    print_verdicts(result.verdicts, console)


def print_result(result: BaselineResult | SpecBenchResult, console) -> None:
    """Either benchmark's result, as its own printer renders it."""
    (print_baseline if isinstance(result, BaselineResult) else print_spec)(result, console)
