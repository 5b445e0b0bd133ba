"""``mlxspec eval-draft``: how much a draft is accepted, measured with the real engine.

For each temperature and K: mean accepted drafts per verification step (tau) and the
acceptance rate of each draft position, on held-out prompts (Spec-Bench, which draft
training never sees), plus the draft's and the target pass's time per step. tau and the
first draft's acceptance carry 95% intervals that resample whole prompts (a prompt's steps
are not independent). Two drafts are compared paired (``--against``: the same prompts and
seeds, the bootstrap resampling prompts for both at once), which cancels what a prompt's text
does to both: fully when greedy (both runs read the target's greedy text), partly when sampled
(the texts part once the two drafts consume the random stream differently). On 24 prompts a
tau difference's interval was 0.05 wide greedy against 0.24 for either draft alone, 0.11
against 0.14 at T = 1.

``eval_draft`` takes an ``EvalOptions`` record; the result is an ``EvalResult`` record, its
``to_json()`` the JSON (schema 2, see ``runs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
from mlxspec.measure.study.stats import Estimate, paired_ratio_difference, ratio_estimate
from mlxspec.targets.drafts import make_drafter

EVAL_KS = (3, 5, 8)


@dataclass(frozen=True)
class PromptTally:
    """One prompt's verify steps: how many, their accepted drafts, how many drafted at all and
    how many of those kept the first draft."""

    steps: int
    accepted: int
    drafting: int
    kept_first: int


def tally(run: Any) -> PromptTally:
    drafting = [a for a, d in zip(run.accepted, run.drafted) if d > 0]
    return PromptTally(len(run.accepted), sum(run.accepted), len(drafting), sum(a > 0 for a in drafting))


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
    per_prompt: list[PromptTally] = field(default_factory=list)


@dataclass(frozen=True)
class PairedRow:
    """The draft minus ``--against`` at one (temperature, K), over the same prompts and seeds."""

    temp: float
    k: int
    tau: Estimate
    first: Estimate


@dataclass(frozen=True)
class EvalResult:
    header: RunHeader
    draft: str
    prompts: list[Any]
    max_tokens: int
    note: str | None
    results: list[EvalRow]
    min_p: float = 0.0  # the filter every T > 0 row sampled through
    against: str | None = None
    against_results: list[EvalRow] = field(default_factory=list)
    paired: list[PairedRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "header": self.header.to_json(), "draft": self.draft, "prompts": list(self.prompts),
                "max_tokens": self.max_tokens, "note": self.note, "min_p": self.min_p,
                "results": [asdict(r) for r in self.results], "against": self.against,
                "against_results": [asdict(r) for r in self.against_results],
                "paired": [asdict(r) for r in self.paired]}


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
    against: str | None = None  # a second draft, measured on the same prompts and seeds


def _row(lm: Any, drafter: Any, ids: list[list[int]], stop: set[int], temp: float, k: int, o: EvalOptions,
         done: Callable[[str], None]) -> EvalRow:
    """One (temperature, K) over every prompt."""
    params = SamplingParams(temp, min_p=o.min_p if temp > 0 else 0.0)
    runs = []
    for i, p in enumerate(ids):
        runs.append(engine_run(lm, p, params, o.max_tokens, stop, o.seed + i, drafter, k))
        done(f"T={temp:g} K={k}")
    s = method_stats(runs, k)
    tallies = [tally(r) for r in runs]
    tau, first = prompt_intervals(tallies)
    return EvalRow(temp, k, s.tau, s.acceptance, s.tokens_per_step, s.tps, s.draft_ms, s.verify_ms, s.steps, s.tokens,
                   _bounds(tau), _bounds(first), tallies)


def prompt_intervals(tallies: Sequence[PromptTally]) -> tuple[Estimate, Estimate]:
    """tau (accepted per step) and the first draft's acceptance (steps keeping a draft over
    steps drafting one) over the prompts' tallies, with bootstrap intervals over prompts."""
    prompts = range(len(tallies))
    return (ratio_estimate([t.accepted for t in tallies], [t.steps for t in tallies], prompts),
            ratio_estimate([t.kept_first for t in tallies], [t.drafting for t in tallies], prompts))


def paired_row(a: EvalRow, b: EvalRow) -> PairedRow:
    """``a`` minus ``b``, measured on the same prompts in the same order and seeds."""
    x, y = a.per_prompt, b.per_prompt
    tau = paired_ratio_difference([t.accepted for t in x], [t.steps for t in x], [t.accepted for t in y],
                                  [t.steps for t in y])
    first = paired_ratio_difference([t.kept_first for t in x], [t.drafting for t in x], [t.kept_first for t in y],
                                    [t.drafting for t in y])
    return PairedRow(a.temp, a.k, tau, first)


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
    other = make_drafter(o.against, lm, lm.dtype) if o.against else None
    if o.against and other is None:
        raise MlxspecError("eval-draft --against needs a drafter, got 'none'")
    total, count = (2 if other else 1) * len(o.ks) * len(o.temps) * len(ids), 0

    def done(label: str) -> None:
        nonlocal count
        count += 1
        if progress:
            progress(count, total, label)

    results = [_row(lm, drafter, ids, stop, temp, k, o, done) for temp in o.temps for k in o.ks]
    against = [_row(lm, other, ids, stop, temp, k, o, done) for temp in o.temps for k in o.ks] if other else []
    return EvalResult(run_header(lm), o.draft, [it["id"] for it in items], o.max_tokens, note, results, o.min_p,
                      o.against, against, [paired_row(a, b) for a, b in zip(results, against)])


def tau_at(result: EvalResult, temp: float, k: int) -> float | None:
    return next((r.tau for r in result.results if r.temp == temp and r.k == k), None)


def _cell(value: float | None, interval: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    if interval is None:
        return f"{value:.2f}"
    lo, hi = (f"{x:.2f}".removeprefix("0") for x in interval)
    return f"{value:.2f} ({lo}-{hi})"


def _difference(e: Estimate) -> str:
    if e.value is None:
        return "-"
    return f"{e.value:+.2f}" + ("" if e.lo is None else f" ({e.lo:+.2f}, {e.hi:+.2f})")


def _print_paired(result: EvalResult, console) -> None:
    table = Table(title=f"{result.draft} minus {result.against}, paired over the same prompts and seeds",
                  caption="(95% interval, resampling prompts for both): one that excludes 0 is a difference")
    for col in ("T", "K", "", result.draft, result.against, "difference"):
        table.add_column(col, justify="right", no_wrap=col == "difference", overflow="fold")
    for a, b, d in zip(result.results, result.against_results, result.paired):
        table.add_row(f"{a.temp:g}", str(a.k), "tau", _cell(a.tau, None), _cell(b.tau, None), _difference(d.tau))
        table.add_row("", "", "1st draft", _cell(a.acceptance[0], None), _cell(b.acceptance[0], None),
                      _difference(d.first), end_section=True)
    console.print(table)


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
    if result.paired:
        _print_paired(result, console)
    if result.note:
        console.print(f"[yellow]{result.note}[/]")
