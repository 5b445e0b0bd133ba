"""``mlxspec eval-draft``: how much a draft is accepted, measured with the real engine.

For each temperature and K: mean accepted drafts per verification step (tau) and the
acceptance rate of each draft position, on held-out prompts (Spec-Bench, which draft
training never sees), plus the draft's and the target pass's time per step. tau and the
first draft's acceptance carry 95% intervals that resample whole prompts (a prompt's steps
are not independent), so two drafts' numbers can be told apart or not.

``eval_draft`` takes an ``EvalOptions`` record; the result is an ``EvalResult`` record, its
``to_json()`` the JSON (schema 2, see ``runs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from mlxspec.core.drafters import parse_k
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import (
    SCHEMA,
    RunHeader,
    engine_run,
    fmt_list,
    method_stats,
    prepare_speculative_run,
    run_header,
    spec_bench_prompts,
)
from mlxspec.measure.study.stats import Estimate, ratio_estimate

EVAL_KS = (3, 5, 8)


@dataclass(frozen=True)
class EvalRow:
    """One (temperature, K): acceptance and costs over all held-out prompts."""

    temp: float
    k: int
    tau: float | None
    acceptance: list[float | None]
    tokens_per_step: float | None
    tps: float
    draft_ms: float | None
    verify_ms: float | None
    steps: int
    tokens: int
    tau_interval: tuple[float, float] | None = None  # 95%, prompts resampled; None under 5 prompts
    first_interval: tuple[float, float] | None = None  # the same for acceptance[0]


@dataclass(frozen=True)
class EvalResult:
    header: RunHeader
    draft: str
    prompts: list[Any]
    max_tokens: int
    note: str | None
    results: list[EvalRow]
    min_p: float = 0.0  # the filter every T > 0 row sampled through

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "header": self.header.to_json(), "draft": self.draft, "prompts": list(self.prompts),
                "max_tokens": self.max_tokens, "note": self.note, "min_p": self.min_p,
                "results": [asdict(r) for r in self.results]}


@dataclass(frozen=True)
class EvalOptions:
    """What ``mlxspec eval-draft`` is asked for: the draft on ``model`` (a spec or a loaded
    model) at every K of ``ks`` and temperature of ``temps``, on ``per_category`` held-out
    Spec-Bench prompts of each of ``categories`` (None: all), prompt i sampled with seed
    ``seed + i``."""

    model: Any
    draft: str
    ks: Sequence[int] = EVAL_KS
    temps: Sequence[float] = (0.0, 1.0)
    per_category: int = 1
    max_tokens: int = 48
    categories: Sequence[str] | None = None
    seed: int = 0
    dtype: str = "auto"
    min_p: float = 0.0  # at T > 0, as the chat samples (-t 1 --min-p 0.1); q is drawn through it too


def _row(lm: Any, drafter: Any, ids: list[list[int]], stop: set[int], temp: float, k: int, o: EvalOptions,
         done: Callable[[str], None]) -> EvalRow:
    """One (temperature, K) over every prompt."""
    params = SamplingParams(temp, min_p=o.min_p if temp > 0 else 0.0)
    runs = []
    for i, p in enumerate(ids):
        runs.append(engine_run(lm, p, params, o.max_tokens, stop, o.seed + i, drafter, k))
        done(f"T={temp:g} K={k}")
    s = method_stats(runs, k)
    tau, first = prompt_intervals(runs)
    return EvalRow(temp, k, s.tau, s.acceptance, s.tokens_per_step, s.tps, s.draft_ms, s.verify_ms, s.steps, s.tokens,
                   _bounds(tau), _bounds(first))


def prompt_intervals(runs: Sequence[Any]) -> tuple[Estimate, Estimate]:
    """tau (accepted per step) and the first draft's acceptance (steps keeping a draft over
    steps drafting one) of ``runs``, one run per prompt, with bootstrap intervals over prompts."""
    steps = [(i, a, d) for i, r in enumerate(runs) for a, d in zip(r.accepted, r.drafted)]
    tau = ratio_estimate([a for _, a, _ in steps], [1.0] * len(steps), [i for i, _, _ in steps])
    drafting = [(i, a) for i, a, d in steps if d > 0]
    first = ratio_estimate([float(a > 0) for _, a in drafting], [1.0] * len(drafting), [i for i, _ in drafting])
    return tau, first


def _bounds(e: Estimate) -> tuple[float, float] | None:
    return None if e.lo is None else (e.lo, e.hi)


def eval_draft(options: EvalOptions, progress: Callable[[int, int, str], None] | None = None) -> EvalResult:
    """tau and acceptance by position of the options' draft for every temperature and K."""
    o = options
    for k in o.ks:
        parse_k(k)
    if not o.ks or not o.temps:
        raise MlxspecError("eval-draft needs at least one K and one temperature")
    SamplingParams(1.0, min_p=o.min_p)  # a bad --min-p is refused before the model loads
    items, note = spec_bench_prompts(list(o.categories) if o.categories else None, o.per_category)
    lm, drafter, stop, ids = prepare_speculative_run(
        o.model, o.draft, o.dtype, items, o.max_tokens, no_drafter="eval-draft needs a drafter, got 'none'")
    total, count = len(o.ks) * len(o.temps) * len(ids), 0

    def done(label: str) -> None:
        nonlocal count
        count += 1
        if progress:
            progress(count, total, label)

    results = [_row(lm, drafter, ids, stop, temp, k, o, done) for temp in o.temps for k in o.ks]
    return EvalResult(run_header(lm), o.draft, [it["id"] for it in items], o.max_tokens, note, results, o.min_p)


def tau_at(result: EvalResult, temp: float, k: int) -> float | None:
    return next((r.tau for r in result.results if r.temp == temp and r.k == k), None)


def _cell(value: float | None, interval: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    if interval is None:
        return f"{value:.2f}"
    lo, hi = (f"{x:.2f}".removeprefix("0") for x in interval)
    return f"{value:.2f} ({lo}-{hi})"


def print_eval(result: EvalResult, console) -> None:
    filtered = f", min-p {result.min_p:g} at T > 0" if result.min_p else ""
    table = Table(title=f"draft {result.draft}: acceptance on {len(result.prompts)} held-out prompts{filtered}",
                  caption="tau: accepted drafts per step. (95% interval, resampling prompts)")
    for col in ("T", "K", "tau", "1st draft", "acceptance by position", "ms draft / verify", "tok/s"):
        # a value and its interval stay on one line; the positions may wrap, not their header's words
        table.add_column(col, justify="right", no_wrap=col in ("tau", "1st draft"),
                         min_width=10 if "position" in col else None)
    for r in result.results:
        table.add_row(f"{r.temp:g}", str(r.k), _cell(r.tau, r.tau_interval), _cell(r.acceptance[0], r.first_interval),
                      fmt_list(r.acceptance), f"{r.draft_ms:.1f} / {r.verify_ms:.1f}", f"{r.tps:.1f}")
    console.print(table)
    if result.note:
        console.print(f"[yellow]{result.note}[/]")
