"""A ``ParityResult`` drawn as rich tables: outputs layer by layer, greedy agreement with the
first divergences, acceptance decisions, speed side by side, then the goals."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table

from mlxspec.measure.parity.records import RELATIVE, Divergence, ParityResult, Speed
from mlxspec.measure.runs import fmt
from mlxspec.measure.verdict import Kind, markup


def _ok(ok: bool) -> str:
    return markup(Kind.PASS, "PASS") if ok else markup(Kind.FAIL, "FAIL")


def _e(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2e}"


def _layer_table(result: ParityResult):
    tol = result.goals.tolerance
    table = Table(title="Outputs, MLX vs torch: relative difference per row",
                  caption=f"relative = {RELATIVE}; goal for the logits: max <= {tol:g}")
    for col in ("output", "max rel", "mean rel", "max abs"):
        table.add_column(col, justify="left" if col == "output" else "right")
    for d in result.layers:
        logits = d.name in ("head", "logits (cached pass)")
        mark = ("" if d.max_rel <= tol else " ✗") if logits else ""
        table.add_row(d.name, _e(d.max_rel) + mark, _e(d.mean_rel), _e(d.max_abs), style="bold" if logits else None)
    return table


def _greedy_table(result: ParityResult):
    n = len(result.settings.prompts)
    table = Table(title=f"Greedy agreement, {n} prompt{'s' * (n != 1)} x {result.settings.max_tokens} tokens",
                  caption="identical: the same tokens on both backends; steps: the same drafts accepted at every "
                          "step; tau: mean accepted drafts per step, MLX / torch")
    for col in ("draft", "K", "identical", "tokens", "steps", "tau", "diverged"):
        table.add_column(col, justify="left" if col == "draft" else "right", no_wrap=col == "draft")
    for g in result.greedy:
        tau = "-" if g.k is None else f"{fmt(g.tau_mlx, '{:.2f}')} / {fmt(g.tau_torch, '{:.2f}')}"
        diverged = ", ".join(x for x in (f"{g.near_ties} near-tie" if g.near_ties else "",
                                         markup(Kind.FAIL, f"{g.mismatches} mismatch") if g.mismatches else "") if x)
        table.add_row("target-only" if g.k is None else g.draft, "-" if g.k is None else str(g.k),
                      f"{g.identical}/{g.prompts}", f"{g.tokens_agreeing}/{g.tokens_compared}",
                      f"{g.same_steps}/{g.prompts}", tau, diverged or "-")
    return table


def _divergence_lines(result: ParityResult) -> list[str]:
    """The first divergence of every method that diverged, with the two tokens' logits."""
    return [f"  {g.label}: {_divergence_text(d)}" for g in result.greedy for d in g.divergences[:1]]


def _divergence_text(d: Divergence | None) -> str:
    if d is None:
        return "-"
    if d.mlx_logits is None:
        return f"{d.prompt} @{d.at}: {d.reason}"
    kind = "near-tie" if d.near_tie else markup(Kind.FAIL, "mismatch")
    return (f"{d.prompt} @{d.at}: {escape(repr(d.mlx_text))} vs {escape(repr(d.torch_text))}, logits MLX {d.mlx_logits[0]:.4f}/"
            f"{d.mlx_logits[1]:.4f}, torch {d.torch_logits[0]:.4f}/{d.torch_logits[1]:.4f} ({kind})")


def _decision_table(result: ParityResult):
    s = result.settings
    table = Table(title=f"Acceptance decisions given the same uniforms ({s.decision_draws} draws per prompt)",
                  caption=f"p: the target at T=1; q: the target at T={s.decision_q_temp:g} (drafts sampled from it); "
                          "keep: min(1, p/q) at a draft; explained: the uniform lies between the two backends' keep")
    for col in ("prompt", "K", "agree", "explained", "unexplained", "mean accepted", "keep max |Δ|",
                "residual max |Δ|"):
        table.add_column(col, justify="left" if col == "prompt" else "right")
    for d in result.decisions:
        table.add_row(str(d.prompt), str(d.k), f"{d.agree}/{d.draws}", str(d.explained),
                      markup(Kind.FAIL, str(d.unexplained)) if d.unexplained else "0", f"{d.mean_accepted:.2f}",
                      _e(d.keep_max_abs), _e(d.residual_max_abs))
    return table


def _speed_table(sp: Speed):
    table = Table(title=f"Target-only greedy decoding, {sp.prompt} ({sp.prompt_tokens}-token prompt, "
                        f"{sp.max_tokens} tokens)",
                  caption=f"{sp.warmup} warm-up, then the median of {sp.mlx.runs} runs per backend")
    for col in ("backend", "decode tok/s (median)", "min - max", "end-to-end tok/s"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for b in (sp.mlx, sp.torch):
        table.add_row(b.backend, f"{b.decode_tps_median:.1f}", f"{b.decode_tps_min:.1f} - {b.decode_tps_max:.1f}",
                      f"{b.tps_median:.1f}")
    table.add_row("torch / mlx", f"{sp.ratio:.2f}x" if sp.ratio is not None else "-", "", "", style="bold")
    return table


def print_parity(result: ParityResult, console) -> None:
    """Render a ``run_parity`` result: header, the four tables, the goals."""
    h, t, s, g = result.header, result.torch, result.settings, result.goals
    console.print(f"[bold]Parity[/] · {h.model}: MLX {h.dtype} ({h.backend}) vs torch {t.version} {t.device} "
                  f"{t.dtype} · {len(s.prompts)} held-out prompts, drafters {', '.join(s.drafters)}, "
                  f"K {', '.join(map(str, s.ks))}")
    if s.note:
        console.print(f"[yellow]{s.note}[/]")
    console.print(_layer_table(result))
    console.print(_greedy_table(result))
    lines = _divergence_lines(result)
    if lines:
        console.print("first divergences (the two tokens' logits at the common prefix, each backend's own pass):")
        for line in lines:
            console.print(line)
    console.print(_decision_table(result))
    if result.speed is not None:
        console.print(_speed_table(result.speed))
    console.print(f"  logits: max relative difference {g.logits_max_rel:.2e} (goal <= {g.tolerance:g}): {_ok(g.logits)}")
    console.print(f"  greedy: identical or near-tie for target-only and every drafter and K: {_ok(g.greedy)}")
    console.print(f"  decisions: no unexplained disagreement: {_ok(g.decisions)}")
    console.print(f"parity: {_ok(g.passed)}" + ("" if g.passed else " (missed: " + "; ".join(g.missed()) + ")"))
