"""``mlxspec eval-draft``: how much a draft is accepted, measured with the real engine.

For each temperature and K: mean accepted drafts per verification step (tau) and the
acceptance rate of each draft position, on held-out prompts (Spec-Bench, which draft
training never sees), plus the draft's and the target pass's time per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlxspec.core.drafters import parse_k
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.bench import (
    _mlxspec_run,
    method_stats,
    prepare_speculative_run,
    run_header,
    spec_bench_prompts,
)

EVAL_KS = (3, 5, 8)


def eval_draft(
    target: Any,
    draft: str,
    ks: Sequence[int] = EVAL_KS,
    temps: Sequence[float] = (0.0, 1.0),
    per_category: int = 1,
    max_tokens: int = 48,
    categories: Sequence[str] | None = None,
    seed: int = 0,
    dtype: str = "auto",
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    for k in ks:
        parse_k(k)
    if not ks or not temps:
        raise MlxspecError("eval-draft needs at least one K and one temperature")
    items, note = spec_bench_prompts(list(categories) if categories else None, per_category)
    lm, drafter, stop, ids = prepare_speculative_run(
        target, draft, dtype, items, max_tokens, no_drafter="eval-draft needs a drafter, got 'none'")
    total, done = len(ks) * len(temps) * len(ids), 0
    results = []
    for temp in temps:
        params = SamplingParams(temp)
        for k in ks:
            rows = []
            for i, p in enumerate(ids):
                rows.append(_mlxspec_run("spec", lm, p, params, max_tokens, stop, seed + i, drafter, k))
                done += 1
                if progress:
                    progress(done, total, f"T={temp:g} K={k}")
            s = method_stats(rows, k)
            results.append({"temp": temp, "k": k, "tau": s["tau"], "acceptance": s["acceptance"],
                            "tokens_per_step": s["tokens_per_step"], "tps": s["tps"],
                            "draft_ms": s["draft_ms"], "verify_ms": s["verify_ms"], "steps": s["steps"],
                            "tokens": s["tokens"]})
    return {"header": run_header(lm), "draft": draft, "prompts": [it["id"] for it in items],
            "max_tokens": max_tokens, "note": note, "results": results}


def tau_at(result: dict[str, Any], temp: float, k: int) -> float | None:
    return next((r["tau"] for r in result["results"] if r["temp"] == temp and r["k"] == k), None)


def print_eval(result: dict[str, Any], console) -> None:
    from rich.table import Table

    table = Table(title=f"draft {result['draft']}: acceptance on {len(result['prompts'])} held-out prompts")
    for col in ("T", "K", "tau", "acceptance by position", "draft ms/step", "verify ms/step", "tok/s"):
        table.add_column(col, justify="right")
    for r in result["results"]:
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["acceptance"])
        table.add_row(f"{r['temp']:g}", str(r["k"]), f"{r['tau']:.2f}", acc, f"{r['draft_ms']:.1f}",
                      f"{r['verify_ms']:.1f}", f"{r['tps']:.1f}")
    console.print(table)
    if result.get("note"):
        console.print(f"[yellow]{result['note']}[/]")
