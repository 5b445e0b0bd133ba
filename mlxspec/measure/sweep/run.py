"""The sweep itself: every K (and auto, and each tree shape) against target-only decoding on the
same prompts, after warm-up, the method order rotating round by round (``core.schedule``), and
one target pass over K+1 tokens timed per K on a warmed cache (``costcurve.time_verify``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxspec.core.drafters import can_branch
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.schedule import timed_rounds, warmup_rounds
from mlxspec.errors import MlxspecError
from mlxspec.core.runs import Run
from mlxspec.measure.runs import (
    WARMUP_TOKENS, engine_run, first_mismatch, prepare_speculative_run, prepared_prompts, progress_ticker, run_header, spec_bench_prompts,
)
from mlxspec.measure.sweep.options import SweepOptions
from mlxspec.measure.sweep.records import SweepResult, SweepRun, SweepSettings, tree_method
from mlxspec.measure.sweep.summary import summarise
from mlxspec.session import Session
from mlxspec.targets.costcurve import time_verify

Method = int | str | None  # 0: target-only, K, None: auto, "tree SHAPE": a tree
Progress = Callable[[int, int, str], Any] | None
OnRun = Callable[[dict[str, Any]], Any] | None
NO_DRAFTER = "a sweep needs a drafter (got 'none'): e.g. --draft ngram:3 or self:8"


def _label(m: Method) -> str:
    return "target-only" if m == 0 else "auto" if m is None else m if isinstance(m, str) else f"K={m}"


@dataclass(frozen=True)
class SweepRunner:
    """run(method, prompt ids, max tokens) for every method of the sweep. Auto starts each run
    from a fresh copy of ``policy`` (the template never drafts, so nothing carries over)."""

    lm: Any
    drafter: Any
    stop: set[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    policy: Any  # the auto policy, None without auto
    shapes: dict[str, Any]  # a tree's method -> its shape, priced on this machine

    def __call__(self, m: Method, p: list[int], n: int | None = None) -> Run:
        n = self.max_tokens if n is None else n
        if isinstance(m, str):
            tree = self.shapes[m]
            return engine_run(self.lm, p, self.params, n, self.stop, self.seed, self.drafter, tree.depth, tree=tree)
        k = self.policy.fresh() if m is None else m or 1
        return engine_run(self.lm, p, self.params, n, self.stop, self.seed, self.drafter if m != 0 else None, k)


def _runner(lm, drafter, stop: set[int], params: SamplingParams, o: SweepOptions,
            say: Callable[[str], None] | None) -> SweepRunner:
    """The session's auto policy and priced tree shapes (the verify-cost curve measured first
    if this machine has none cached), in a runner."""
    if o.trees and not can_branch(drafter):
        raise MlxspecError(f"drafter {o.draft!r} cannot branch: --tree needs a draft model, self:L, an eagle head or ngram:N")
    session = Session(lm, remeasure_cost=o.remeasure_cost, log=say)
    policy = session.use(drafter, "auto").policy if o.auto else None
    shapes = {tree_method(str(t)): session.priced(t) for t in o.trees}
    return SweepRunner(lm, drafter, stop, params, o.seed, o.max_tokens, policy, shapes)


def _sweep_round(run: Callable[[Method, list[int]], Run], order: list[Method], it: dict[str, Any], p: list[int],
                 r: int, greedy: bool, report: Callable[[Method, Run], None]) -> dict[Method, SweepRun]:
    """Every method once on one prompt, in ``order``; ratios to target-only."""
    got: dict[Method, Run] = {}
    for m in order:
        got[m] = run(m, p)
        report(m, got[m])
    base = got[0]
    return {m: SweepRun(m, it["id"], it["category"], r, x,
                        ratio=(x.tps / base.tps if base.tps > 0 else None) if m != 0 else None,
                        first_mismatch=first_mismatch(base.tokens, x.tokens) if m != 0 and greedy else None)
            for m, x in got.items()}


def time_sweep_runs(run: Callable[[Method, list[int]], Run], methods: list[Method], items: list[dict[str, Any]],
                    ids: list[list[int]], repeats: int, greedy: bool, tick: Callable[[str], None],
                    on_run: OnRun) -> dict[Method, list[SweepRun]]:
    """Every (repeat, prompt) round, the method order rotating round by round to spread drift
    (``core.schedule``); each run reported to ``on_run`` and ``tick``."""
    runs_by: dict[Method, list[SweepRun]] = {m: [] for m in methods}
    done = {m: 0 for m in methods}
    rounds = [(r, it, p) for r in range(repeats) for it, p in zip(items, ids)]
    for (r, it, p), order in timed_rounds(methods, rounds):

        def report(m: Method, x: Run, it: dict[str, Any] = it, r: int = r) -> None:
            done[m] += 1
            if on_run is not None:
                on_run({"k": m, "prompt_id": it["id"], "category": it["category"], "repeat": r, "tps": x.tps,
                        "accepted": list(x.accepted), "drafted": list(x.drafted), "rooms": list(x.rooms),
                        "done": done[m], "of": repeats * len(items)})
            tick(f"{_label(m)} · {it['category']} #{it['id']} · repeat {r + 1}/{repeats}")

        got = _sweep_round(run, order, it, p, r, greedy, report)
        for m in methods:
            runs_by[m].append(got[m])
    return runs_by


def _warm_up(run: SweepRunner, methods: list[Method], o: SweepOptions, p: list[int],
             tick: Callable[[str], None]) -> None:
    for w, order in enumerate(warmup_rounds(methods, o.warmup)):
        for m in order:
            run(m, p, min(o.max_tokens, WARMUP_TOKENS))
            tick(f"warm-up {w + 1}/{o.warmup} · {_label(m)}")


def _settings(o: SweepOptions, items: list[dict[str, Any]], policy: Any) -> SweepSettings:
    return SweepSettings(o.ks, o.draft, o.temp, o.top_p, list(dict.fromkeys(it["category"] for it in items)),
                         o.per_category if o.prompts_file is None else None,
                         str(o.prompts_file) if o.prompts_file is not None else None, o.max_tokens, o.warmup,
                         min(o.max_tokens, WARMUP_TOKENS), o.repeats, o.seed, o.verify_reps,
                         auto_max_k=policy.max_k if policy is not None else None,
                         trees=[str(t) for t in o.trees],
                         tree_nodes=next((t.max_nodes for t in o.trees), None))


def run_sweep(options: SweepOptions, progress: Progress = None, on_run: OnRun = None) -> SweepResult:
    """Sweep K for ``options.draft`` on ``options.model``: warm-up, the verify costs, then every
    (repeat, prompt) round through every method, and the result (``summarise``).
    ``progress(done, total, label)``; ``on_run(run)`` after every timed run, for live displays:
    plain values {k (0 = target-only, None = auto), prompt_id, category, repeat, tps, accepted,
    drafted, rooms (per step), done, of (runs of this K)}.
    """
    o = options.checked()
    params = SamplingParams(temperature=o.temp, top_p=o.top_p)
    items, note = spec_bench_prompts(list(o.categories) if o.categories else None, o.per_category, o.prompts_file)
    lm, drafter, stop, ids = prepare_speculative_run(o.model, o.draft, o.dtype, items, o.max_tokens, NO_DRAFTER)
    methods: list[Method] = [0, *o.ks, *([None] if o.auto else []), *(tree_method(str(t)) for t in o.trees)]
    sizes = sorted({1} | {k + 1 for k in o.ks})
    total = o.warmup * len(methods) + o.verify_reps + o.repeats * len(items) * len(methods)
    say = (lambda text: progress(0, total, text)) if progress is not None else None
    run = _runner(lm, drafter, stop, params, o, say)
    tick = progress_ticker(progress, total)
    _warm_up(run, methods, o, ids[0], tick)
    vt = time_verify(lm.model, ids[0], sizes, o.verify_reps,
                     progress=lambda r: tick(f"verify cost · {r}/{o.verify_reps} rounds over {len(sizes)} sizes"))
    runs_by = time_sweep_runs(run, methods, items, ids, o.repeats, params.greedy, tick, on_run)
    return summarise(o.ks, runs_by, vt, len(ids[0]), run_header(lm), _settings(o, items, run.policy), note,
                     prepared_prompts(items, ids))
