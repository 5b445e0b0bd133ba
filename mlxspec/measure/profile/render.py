"""A ``StepProfile`` drawn as rich tables: the step's parts, the target pass over L tokens,
and with ``--compare`` every forward path side by side; then one line on the slope."""

from __future__ import annotations

from rich.table import Table

from mlxspec.measure.profile.records import (DRAFT_BUILD, DRAFT_EVAL, SYNCS_PER_STEP, TARGET_BUILD, TARGET_EVAL,
                                             StepProfile)
from mlxspec.measure.verdict import Comparison, markup

# On an eager backend (torch) the "build" parts compute as they go and the "evaluate" parts
# only wait for an accelerator's queue: the rows say so.
EAGER_NAMES = {DRAFT_BUILD: "draft: run (Python and arithmetic)", DRAFT_EVAL: "draft: wait for the device",
               TARGET_BUILD: "target pass: run (Python and arithmetic)", TARGET_EVAL: "target pass: wait for the device"}


def _phase_table(result: StepProfile):
    s = result.settings
    total = result.instrumented_ms
    h = result.header
    t = Table(title=f"one step: {s.model} ({h.backend}, {h.dtype}) + {s.draft}, K={s.k}, T={s.temp:g} "
                    f"(medians of {s.steps} steps, {s.prompt_tokens}-token prompt)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for p in result.phases:
        name = EAGER_NAMES.get(p.name, p.name) if result.eager else p.name
        t.add_row(name, f"{p.ms:.2f}", f"{p.ms / total:.0%}" if total > 0 else "-")
    t.add_row("[bold]sum (instrumented step)[/]", f"[bold]{total:.2f}[/]", "100%")
    if result.python_ms is not None:
        t.add_row("  of which Python (graph building + bookkeeping)", f"{result.python_ms:.2f}",
                  f"{result.python_ms / total:.0%}" if total > 0 else "-")
    if result.sync_ms is not None:
        t.add_row(f"  one host sync (engine: {SYNCS_PER_STEP} a step, inside the evals)",
                  f"{result.sync_ms:.3f}", "")
    if result.eager:
        t.caption = "torch runs eagerly: a part's Python and arithmetic are not told apart"
    if result.engine_step_ms is not None:
        t.add_row("engine step (draft + verify, same K)", f"{result.engine_step_ms:.2f}", "")
    return t


def _verify_table(result: StepProfile):
    t = Table(title=f"target pass over L tokens (medians of {result.settings.repeats})")
    t.add_column("L", justify="right")
    t.add_column("ms", justify="right")
    t.add_column("x one token", justify="right")
    for v in result.verify:
        t.add_row(str(v.tokens), f"{v.ms:.2f}", f"{v.ratio:.2f}")
    return t


def _paths_table(result: StepProfile):
    paths = result.paths or []
    t = Table(title=f"target pass per forward path, side by side (ms, medians of {result.settings.repeats} rounds)")
    t.add_column("L", justify="right")
    for p in paths:
        t.add_column(p.path, justify="right")
    for i, v in enumerate(result.verify):
        t.add_row(str(v.tokens), *(f"{p.ms[i]:.1f}" for p in paths))
    t.add_row("slope", *(f"{p.slope:.3f}" for p in paths))

    def speed(c: Comparison) -> str:
        if c.ratio is None:
            return "-"
        text = f"{c.ratio:.2f}x" + ("" if c.interval is None else f" [{c.interval.lo:.2f}, {c.interval.hi:.2f}]")
        return markup(c.kind, text)

    t.add_row("speedup", *("1.00x" if p.path == "plain" else speed(p.speedup) for p in paths))
    return t


def print_profile(result: StepProfile, console) -> None:
    """The step breakdown and the verify-cost table, then one line on the slope."""
    console.print(_phase_table(result))
    console.print(_verify_table(result))
    if result.paths:
        console.print(_paths_table(result))
    console.print(f"each extra verified token costs [bold]{result.slope:.3f}[/] of a one-token pass "
                  f"(least-squares slope over L = 2..{result.settings.k + 1}); accepted "
                  f"{result.accepted_mean:.2f} drafts per profiled step")
